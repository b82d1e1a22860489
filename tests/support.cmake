# Helpers shared by end-to-end tests: child processes (start, capture stderr, wait for a port,
# stop by PID), a blocking HTTP/1.1 client and samples of the Prometheus text format.
add_library(idemgate_test_support STATIC
  support/process.cpp
  support/http_client.cpp
  support/metric_text.cpp
  support/process_memory.cpp
  support/h2_frames.cpp
)
target_link_libraries(idemgate_test_support PUBLIC Boost::headers Threads::Threads)

# What the scale and fault suites share, on top of the e2e fixture (e2e.cmake): private stores
# (scripts/local-stores) for a whole binary, timed requests and the kinds of keyed answer, a
# steady keyed load with the checks of its answers, metrics and log lines of the gateways, and
# the `keys` command against them.
add_library(idemgate_test_load STATIC
  support/local_stores.cpp
  support/answers.cpp
  support/keyed_load.cpp
  support/scraping.cpp
  support/keys_cli.cpp
)
target_link_libraries(idemgate_test_load PUBLIC idemgate_e2e_fixture Boost::json)
