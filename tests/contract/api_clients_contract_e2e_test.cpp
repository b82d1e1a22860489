// What API clients ask of the gateway (SPEC §4c), end to end through the real binary: key
// header aliases (C55), key formats (C56) and browsers (C57).
#define BOOST_TEST_MODULE api_clients_contract_e2e
#include <boost/test/unit_test.hpp>

#include "tests/contract/contract_support.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;

/// A gateway with one required route `name` on `/p` to `upstream`, with extra idempotency lines.
GatewayConfig one_route(const TestUpstream& upstream, const std::string& name,
                        std::vector<std::string> extra) {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route(name, "/p", "up", "required", std::move(extra))};
  return config;
}

HttpRequest post_with(const HeaderList& fields) {
  HttpRequest req;
  req.method = "POST";
  req.target = "/p";
  req.headers = {{"Content-Type", "application/json"}};
  req.headers.insert(req.headers.end(), fields.begin(), fields.end());
  req.body = "{}";
  return req;
}

/// Nothing of `key` reached the stores: no record, no lock (C56: refused before the filter).
void check_nothing_stored(const std::string& route_name, const std::string& key) {
  Database db(std::getenv("IDEMGATE_PG_DSN"));
  BOOST_TEST(!record_exists(db, route_name, key), "a record exists for " << key);
  RedisClient redis;
  BOOST_TEST(!redis.exists(lock_key(record_id_hex(route_name, key))), "a lock exists for " << key);
}

}  // namespace

// -------------------------------------------------------------------------------------------
// C55 Key header aliases

BOOST_AUTO_TEST_CASE(spec_C55_a_legacy_key_header_is_an_alias_of_idempotency_key) {
  TestUpstream upstream;
  const std::string name = unique_route("c55_alias");
  Gateway gateway(one_route(upstream, name, {"key_headers: [Idempotency-Key, X-Idempotency-Key]"}));
  const std::string key = unique_name("c55");

  const HttpResponse first = gateway.send(post_with({{"X-Idempotency-Key", key}}));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  BOOST_TEST(!replayed(first));
  // The same key under the other name is the same operation.
  const HttpResponse retry = gateway.send(post_with({{"Idempotency-Key", key}}));
  BOOST_TEST(retry.status == 201u, describe(retry));
  BOOST_TEST(replayed(retry), describe(retry));
  BOOST_TEST(retry.body == first.body);
  // Both names with one value (after C13 decoding) are one key.
  const HttpResponse both =
      gateway.send(post_with({{"Idempotency-Key", "\"" + key + "\""}, {"X-Idempotency-Key", key}}));
  BOOST_TEST(replayed(both), describe(both));
  BOOST_TEST(upstream.count("/p") == 1u);
  // The upstream got the key under the name the client used (passthrough).
  BOOST_TEST(upstream.received("/p").front().value("X-Idempotency-Key").value_or("") == key);
}

BOOST_AUTO_TEST_CASE(spec_C55_two_key_headers_with_different_values_get_400_naming_both) {
  TestUpstream upstream;
  const std::string name = unique_route("c55_conflict");
  Gateway gateway(one_route(upstream, name, {"key_headers: [Idempotency-Key, X-Idempotency-Key]"}));
  const std::string key = unique_name("c55");

  const HttpResponse res =
      gateway.send(post_with({{"Idempotency-Key", key}, {"X-Idempotency-Key", key + "-other"}}));
  BOOST_TEST(is_problem(res, 400));
  BOOST_TEST(problem_type_ends_with(res, "/invalid-key"), describe(res));
  const std::string detail = problem_detail(res);
  BOOST_TEST(detail.find("Idempotency-Key and X-Idempotency-Key") != std::string::npos, detail);
  BOOST_TEST(upstream.total() == 0u);
  check_nothing_stored(name, key);
}

BOOST_AUTO_TEST_CASE(spec_C55_a_required_route_names_every_key_header_when_none_is_sent) {
  TestUpstream upstream;
  Gateway gateway(one_route(upstream, unique_route("c55_missing"),
                            {"key_headers: [Idempotency-Key, X-Idempotency-Key]"}));
  const HttpResponse res = gateway.send(post_with({}));
  BOOST_TEST(is_problem(res, 400));
  BOOST_TEST(problem_detail(res).find("X-Idempotency-Key") != std::string::npos, describe(res));
  BOOST_TEST(upstream.total() == 0u);
}

// -------------------------------------------------------------------------------------------
// C56 Key formats

BOOST_AUTO_TEST_CASE(spec_C56_uuid_format_refuses_other_keys_before_lock_record_or_upstream) {
  TestUpstream upstream;
  const std::string name = unique_route("c56_uuid");
  Gateway gateway(one_route(upstream, name, {"key_format: uuid"}));

  const std::string bad = unique_name("c56");
  const HttpResponse refused = gateway.send(keyed_post("/p", bad, "{}"));
  BOOST_TEST(is_problem(refused, 400));
  BOOST_TEST(problem_type_ends_with(refused, "/invalid-key"), describe(refused));
  BOOST_TEST(problem_detail(refused).find("UUID") != std::string::npos, describe(refused));
  BOOST_TEST(upstream.total() == 0u);
  check_nothing_stored(name, bad);

  // A fresh UUID per run: the record table is shared with other runs.
  const std::string uuid = "0f8fad5b-d9cb-469f-a165-" + record_id_hex(name, bad).substr(0, 12);
  const HttpResponse ok = gateway.send(keyed_post("/p", uuid, "{}"));
  BOOST_TEST(ok.status == 201u, gateway.explain(ok));
  const HttpResponse again = gateway.send(keyed_post("/p", uuid, "{}"));
  BOOST_TEST(replayed(again), describe(again));
  BOOST_TEST(upstream.count("/p") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C56_pattern_format_states_the_rule_and_stores_nothing) {
  TestUpstream upstream;
  const std::string name = unique_route("c56_pattern");
  Gateway gateway(one_route(upstream, name, {"key_format: { pattern: \"ord_[a-z0-9_-]{8,}\" }"}));

  const std::string bad = "x" + unique_name("ord");
  const HttpResponse refused = gateway.send(keyed_post("/p", bad, "{}"));
  BOOST_TEST(is_problem(refused, 400));
  BOOST_TEST(problem_detail(refused).find("ord_[a-z0-9_-]{8,}") != std::string::npos,
             describe(refused));
  BOOST_TEST(upstream.total() == 0u);
  check_nothing_stored(name, bad);

  std::string good = "ord_" + unique_name("k");
  std::transform(good.begin(), good.end(), good.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const HttpResponse ok = gateway.send(keyed_post("/p", "\"" + good + "\"", "{}"));
  BOOST_TEST(ok.status == 201u, gateway.explain(ok));
  BOOST_TEST(upstream.count("/p") == 1u);
}
