# Configuration loader (SPEC §2). Sample files live in tests/data/config/.
idemgate_test(config_loader_test unit
  SOURCES unit/config_loader_test.cpp
  LIBS idemgate_config)
# conf/REFERENCE.md's key tables against the loader's own tables.
idemgate_test(config_reference_test unit
  SOURCES unit/config_reference_test.cpp
  LIBS idemgate_config)
# SPEC §4c keys (C55-C58) and the one key reader (C13, C37, C55, C56).
idemgate_test(config_keys_test unit SOURCES unit/config_keys_test.cpp LIBS idemgate_config)
idemgate_test(key_reader_test unit SOURCES unit/key_reader_test.cpp LIBS idemgate_core)
