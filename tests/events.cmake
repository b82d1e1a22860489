# Events delivered over HTTP (SPEC C37): every key_source form end to end on real idemgate and
# payment-service processes, and the example configurations in conf/examples checked by
# `idemgate check-config`. Stores come from the environment, as for tests/e2e.
idemgate_test(events_e2e_test e2e
  SOURCES events/events_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
add_dependencies(events_e2e_test idemgate payment-service)
