# The SPEC §3/§4 contract end to end, case by case: real idemgate processes in front of the
# example payment service or the in-test upstream of tests/e2e, with the stores from the
# environment. Three executables so that one area can be run (and fail) on its own.
foreach(suite idempotency_contract concurrency_contract framing_contract h2_contract h2_attacks)
  idemgate_test(${suite}_e2e_test e2e
    SOURCES contract/${suite}_e2e_test.cpp
    LIBS idemgate_e2e_fixture)
  add_dependencies(${suite}_e2e_test idemgate payment-service)
endforeach()
