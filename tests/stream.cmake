# Streaming and protocol upgrades (SPEC C38, C40): the real idemgate in front of stream-upstream,
# a test upstream that generates and checks GiB bodies piece by piece, dies mid-body, echoes
# WebSocket messages and refuses to be upgraded to h2c. Stores come from the environment, as for
# tests/e2e.
add_executable(stream-upstream support/stream_upstream.cpp)
target_link_libraries(stream-upstream PRIVATE Boost::headers Boost::json Threads::Threads)

idemgate_test(streaming_e2e_test e2e
  SOURCES http/streaming_e2e_test.cpp
  LIBS idemgate_ops_support)
# The test starts both binaries; build them with it.
add_dependencies(streaming_e2e_test idemgate stream-upstream)
# Its GiB bodies make it the longest suite with no lock: it starts among the first.
idemgate_runs_long(streaming_e2e_test)
