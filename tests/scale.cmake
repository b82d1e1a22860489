# Scale-out on the stores' own machinery (SPEC §6, label `scale`): the real gateway and payment
# service against a Redis Sentinel deployment that the test binary starts on loopback and fails
# over, plus a private Postgres (scripts/local-stores), so the suite needs no store variables.
idemgate_test(redis_sentinel_scale_e2e_test scale
  SOURCES scale/redis_sentinel_scale_e2e_test.cpp scale/redis_sentinel.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture idemgate_ops_support PkgConfig::HIREDIS)
# The test starts both binaries; build them with it. The failovers and the private stores must
# not share the machine's two cores with other store suites.
add_dependencies(redis_sentinel_scale_e2e_test idemgate payment-service)
set_tests_properties(redis_sentinel_scale_e2e_test PROPERTIES RUN_SERIAL TRUE)
