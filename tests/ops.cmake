# Operations (SPEC §1 signals, §5, label `ops`): metrics without a network, then the real
# binary's admin endpoints, reload, drain, `keys`, TLS on both sides (certificates made with the
# openssl CLI at test time), readiness on private stores, and the compose file.
add_library(idemgate_ops_support STATIC ops/ops_support.cpp)
target_link_libraries(idemgate_ops_support PUBLIC idemgate_test_load OpenSSL::SSL)

idemgate_test(metrics_test ops
  SOURCES ops/metrics_test.cpp
  LIBS idemgate_app idemgate_test_support)

foreach(suite ops_e2e_test ops_tls_e2e_test ops_readiness_e2e_test)
  idemgate_test(${suite} ops SOURCES ops/${suite}.cpp LIBS idemgate_ops_support)
  add_dependencies(${suite} idemgate)
endforeach()
# Stores of its own: the script starts them, so no shared variable is needed.
idemgate_starts_stores(ops_readiness_e2e_test)

# The compose file parses (the docker-compose client validates offline; scripts/install-deps
# installs it) and the gateway configuration it runs is valid.
add_test(NAME docker_compose_config_is_valid
         COMMAND docker-compose -f ${PROJECT_SOURCE_DIR}/docker-compose.yml config -q)
add_test(NAME compose_gateway_config_is_valid
         COMMAND idemgate check-config ${PROJECT_SOURCE_DIR}/conf/compose.yaml)
set_tests_properties(docker_compose_config_is_valid compose_gateway_config_is_valid
                     PROPERTIES LABELS ops TIMEOUT 120)

# Alerting rules and dashboard (conf/prometheus, conf/grafana): promtool checks and unit-tests the
# rules and parses every dashboard expression; a real Prometheus scrapes a real gateway through a
# Postgres outage (tests/ops/prometheus_alerts_e2e_test.cpp). All need Debian's `prometheus`
# package (scripts/install-deps): where it is not installed they are skipped, never failed.
set(idemgate_if_prometheus bash ${PROJECT_SOURCE_DIR}/tests/prometheus/if-prometheus)
add_test(NAME prometheus_alert_rules_check
         COMMAND ${idemgate_if_prometheus} promtool check rules
                 ${PROJECT_SOURCE_DIR}/conf/prometheus/alerts.yaml)
add_test(NAME prometheus_alert_rules_test
         COMMAND ${idemgate_if_prometheus} promtool test rules
                 ${PROJECT_SOURCE_DIR}/tests/prometheus/alerts_test.yaml)
add_test(NAME prometheus_dashboard_check
         COMMAND ${idemgate_if_prometheus} python3
                 ${PROJECT_SOURCE_DIR}/tests/prometheus/check_dashboard.py
                 ${PROJECT_SOURCE_DIR}/conf/grafana/idemgate.json promtool)
set_tests_properties(prometheus_alert_rules_check prometheus_alert_rules_test
                     prometheus_dashboard_check
                     PROPERTIES LABELS ops TIMEOUT 120 SKIP_RETURN_CODE 77)

add_executable(prometheus_alerts_e2e_test ops/prometheus_alerts_e2e_test.cpp
                                          ops/prometheus_server.cpp)
target_link_libraries(prometheus_alerts_e2e_test PRIVATE idemgate_ops_support
                                                         Boost::unit_test_framework)
target_compile_definitions(prometheus_alerts_e2e_test PRIVATE BOOST_TEST_DYN_LINK)
add_dependencies(prometheus_alerts_e2e_test idemgate)
add_test(NAME prometheus_alerts_e2e_test
         COMMAND ${idemgate_if_prometheus} $<TARGET_FILE:prometheus_alerts_e2e_test>
                 --log_level=test_suite --report_level=short)
# Stores of its own: the test starts them, so no shared variable is needed.
set_tests_properties(prometheus_alerts_e2e_test PROPERTIES
  LABELS ops TIMEOUT 900 SKIP_RETURN_CODE 77
  ENVIRONMENT "IDEMGATE_BINARY_DIR=${PROJECT_BINARY_DIR};IDEMGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
idemgate_starts_stores(prometheus_alerts_e2e_test)

# SPEC C58: store checks at start, on SIGHUP, in check-config --stores and /readyz, on stores of
# its own whose settings it changes.
idemgate_test(store_checks_e2e_test ops SOURCES ops/store_checks_e2e_test.cpp
  LIBS idemgate_ops_support PkgConfig::HIREDIS)
add_dependencies(store_checks_e2e_test idemgate)
idemgate_starts_stores(store_checks_e2e_test)
# The readiness report's rendering (C58), without stores.
idemgate_test(readiness_report_test unit SOURCES unit/readiness_report_test.cpp LIBS idemgate_app)
