# SPEC §4c through the real binary: key aliases and formats (C55, C56), CORS (C57).
idemgate_test(api_clients_contract_e2e_test e2e
  SOURCES contract/api_clients_contract_e2e_test.cpp
  LIBS idemgate_e2e_fixture)
add_dependencies(api_clients_contract_e2e_test idemgate payment-service)
