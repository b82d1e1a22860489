# HTTP shell: router and header rules (unit), the proxy over real loopback sockets (e2e, no stores).
idemgate_test(router_test unit SOURCES unit/router_test.cpp LIBS idemgate_http_rules)
idemgate_test(headers_test unit SOURCES unit/headers_test.cpp LIBS idemgate_http_rules)
idemgate_test(request_rules_test unit SOURCES unit/request_rules_test.cpp LIBS idemgate_http_rules)
idemgate_test(proxy_e2e_test e2e SOURCES http/proxy_e2e_test.cpp LIBS idemgate_http)
idemgate_test(upstream_response_test unit SOURCES unit/upstream_response_test.cpp LIBS idemgate_http_rules)
idemgate_test(json_log_test unit SOURCES unit/json_log_test.cpp LIBS idemgate_http)
idemgate_test(request_id_test unit SOURCES unit/request_id_test.cpp LIBS idemgate_http_rules)
idemgate_test(h2_codec_test unit SOURCES unit/h2_codec_test.cpp LIBS idemgate_h2_codec idemgate_test_support)
