# The gateway end to end: the real idemgate and payment-service binaries as child processes over
# loopback, against the stores in IDEMGATE_PG_DSN / IDEMGATE_PAYMENTS_DSN / IDEMGATE_REDIS_ADDR.
# The fixture is a library so that further end-to-end suites can reuse it.
add_library(idemgate_e2e_fixture STATIC e2e/gateway_fixture.cpp)
target_link_libraries(idemgate_e2e_fixture
  PUBLIC idemgate_test_support Boost::headers Boost::json Boost::unit_test_framework
  PRIVATE idemgate_core PostgreSQL::PostgreSQL PkgConfig::HIREDIS)
target_compile_definitions(idemgate_e2e_fixture PUBLIC BOOST_TEST_DYN_LINK)

idemgate_test(gateway_e2e_test e2e
  SOURCES e2e/gateway_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
# The test starts both binaries; build them with it.
add_dependencies(gateway_e2e_test idemgate payment-service)

# Request ids and W3C traceparent (conf/REFERENCE.md, request_id) through the real binary.
idemgate_test(request_id_e2e_test e2e
  SOURCES e2e/request_id_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
add_dependencies(request_id_e2e_test idemgate)
