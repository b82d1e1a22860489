# SPEC §4c through the real binary: key aliases and formats (C55, C56), CORS (C57).
idemgate_test(api_clients_contract_e2e_test e2e
  SOURCES contract/api_clients_contract_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
add_dependencies(api_clients_contract_e2e_test idemgate payment-service)
# C57 with a real browser: headless Chromium (Debian's `chromium`, scripts/install-deps).
idemgate_test(browser_cors_e2e_test e2e
  SOURCES contract/browser_cors_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
add_dependencies(browser_cors_e2e_test idemgate)
