idemgate_test(idempotency_key_test unit SOURCES unit/idempotency_key_test.cpp LIBS idemgate_core)
idemgate_test(fingerprint_test unit SOURCES unit/fingerprint_test.cpp LIBS idemgate_core)
idemgate_test(idempotency_filter_test unit SOURCES unit/idempotency_filter_test.cpp LIBS idemgate_core)
