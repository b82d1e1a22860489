# Overload (SPEC §7: C52 connection and tunnel limits, C53 load shedding, C54 bounded queues).
# The keys, the descriptor budget and the counting behind them, without a network:
idemgate_test(overload_test unit SOURCES unit/overload_test.cpp LIBS idemgate_app)

# The real binary under a descriptor limit the test sets, idle floods, a slow upstream and a
# frozen Postgres, on stores of its own (scripts/local-stores) that it restarts and freezes.
idemgate_test(overload_e2e_test fault
  SOURCES overload/overload_e2e_test.cpp
  LIBS idemgate_test_load idemgate_ops_support)
add_dependencies(overload_e2e_test idemgate)
idemgate_starts_stores(overload_e2e_test)
# Makes accept() of the child fail with EMFILE/ENFILE on demand (fail_accept.cpp says why).
add_library(idemgate_fail_accept MODULE support/fail_accept.cpp)
target_link_libraries(idemgate_fail_accept PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(overload_e2e_test idemgate_fail_accept)
target_compile_definitions(overload_e2e_test PRIVATE
  IDEMGATE_FAIL_ACCEPT_LIBRARY="$<TARGET_FILE:idemgate_fail_accept>")
