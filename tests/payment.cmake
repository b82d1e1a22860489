# The example payment upstream: its request parsing (unit) and the real binary over loopback
# against Postgres from IDEMGATE_PAYMENTS_DSN (e2e).
idemgate_test(payment_request_test unit
  SOURCES payment/payment_request_test.cpp
  LIBS payment_service_lib)

idemgate_test(payment_service_e2e_test e2e
  SOURCES payment/payment_service_e2e_test.cpp
  LIBS idemgate_test_support Boost::json PostgreSQL::PostgreSQL)
# The test starts the binary; build it with the test.
add_dependencies(payment_service_e2e_test payment-service)
