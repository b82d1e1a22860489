# Configuration loader (SPEC §2). Sample files live in tests/data/config/.
idemgate_test(config_loader_test unit
  SOURCES unit/config_loader_test.cpp
  LIBS idemgate_config)
# conf/REFERENCE.md's key tables against the loader's own tables.
idemgate_test(config_reference_test unit
  SOURCES unit/config_reference_test.cpp
  LIBS idemgate_config)
