# What every module uses (gateway/common).
idemgate_test(common_test unit SOURCES unit/common_test.cpp LIBS idemgate_common)
idemgate_test(idempotency_key_test unit SOURCES unit/idempotency_key_test.cpp LIBS idemgate_core)
# The fingerprint test reads requests through the session's body reader and the handler's
# request_fingerprint (C27), so it links the gateway library.
idemgate_test(fingerprint_test unit SOURCES unit/fingerprint_test.cpp LIBS idemgate_app)
idemgate_test(idempotency_filter_test unit SOURCES unit/idempotency_filter_test.cpp LIBS idemgate_core)
idemgate_test(memory_fakes_contract_test unit SOURCES unit/memory_fakes_contract_test.cpp LIBS idemgate_core)
idemgate_test(primary_tracker_test unit SOURCES unit/primary_tracker_test.cpp LIBS idemgate_core)

# Known answers for every stored or keyed format (tests/data/vectors/README.md): the identity
# hashes of the core, the Postgres header blob, the Redis key names and hash slots. The vector
# files are recomputed a second time, independently of the product code, by recompute.py.
idemgate_test(known_answer_test unit SOURCES unit/known_answer_test.cpp
  LIBS idemgate_pg idemgate_redis)
add_test(NAME known_answer_vectors_recompute
         COMMAND python3 ${PROJECT_SOURCE_DIR}/tests/data/vectors/recompute.py)
set_tests_properties(known_answer_vectors_recompute PROPERTIES LABELS unit TIMEOUT 120)
