# Helpers shared by end-to-end tests: child processes (start, capture stderr, wait for a port,
# stop by PID) and a blocking HTTP/1.1 client.
add_library(idemgate_test_support STATIC
  support/process.cpp
  support/http_client.cpp
  support/process_memory.cpp
)
target_link_libraries(idemgate_test_support PUBLIC Boost::headers Threads::Threads)
