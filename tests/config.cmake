# Configuration loader (SPEC §2). Sample files live in tests/data/config/.
idemgate_test(config_loader_test unit
  SOURCES unit/config_loader_test.cpp
  LIBS idemgate_config)
