# Fault injection (SPEC C23–C26): the real gateway and payment service against a private Postgres
# and Redis that the test binary starts with scripts/local-stores and then stops, stalls and
# disturbs, so it needs no store variables and shares no store with other suites.
idemgate_test(fault_e2e_test fault
  SOURCES fault/fault_e2e_test.cpp
  LIBS idemgate_test_load PkgConfig::HIREDIS PostgreSQL::PostgreSQL)
# The test starts both binaries; build them with it.
add_dependencies(fault_e2e_test idemgate payment-service)
idemgate_starts_stores(fault_e2e_test)
