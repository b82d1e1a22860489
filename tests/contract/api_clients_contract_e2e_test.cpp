// What API clients ask of the gateway (SPEC §4c), end to end through the real binary: key
// header aliases (C55), key formats (C56) and browsers (C57).
#define BOOST_TEST_MODULE api_clients_contract_e2e
#include <boost/test/unit_test.hpp>
#include <future>

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

// -------------------------------------------------------------------------------------------
// C57 Browsers (CORS)

namespace {

const std::string kAppOrigin = "http://app.test:8000";

/// Routes for the CORS cases: `/p/` keyed with `cors`, `/plain` keyed without.
GatewayConfig cors_gateway(const TestUpstream& upstream, const std::string& cors_route,
                           const std::string& plain_route) {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes_yaml = "  - name: " + cors_route +
                       "\n"
                       "    match: { path_prefix: /p/ }\n"
                       "    upstream: up\n"
                       "    idempotency: { mode: required, key_headers: [Idempotency-Key, "
                       "X-Idempotency-Key] }\n"
                       "    cors: { allow_origins: [\"" +
                       kAppOrigin +
                       "\"], allow_headers: [Content-Type], "
                       "expose_headers: [Location], max_age: 600s }\n"
                       "  - name: " +
                       plain_route +
                       "\n"
                       "    match: { path_prefix: /plain }\n"
                       "    upstream: up\n"
                       "    idempotency: { mode: required }\n";
  return config;
}

HttpRequest preflight(const std::string& target, const std::string& origin) {
  HttpRequest req;
  req.method = "OPTIONS";
  req.target = target;
  req.headers = {{"Origin", origin},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "content-type,idempotency-key"}};
  return req;
}

bool lists(const HttpResponse& res, const std::string& field, const std::string& token) {
  const std::string value = res.header(field).value_or("");
  std::string lower_value = value;
  std::string lower_token = token;
  for (auto* s : {&lower_value, &lower_token}) {
    std::transform(s->begin(), s->end(), s->begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  }
  std::size_t start = 0;
  while (start <= lower_value.size()) {
    auto end = lower_value.find(',', start);
    if (end == std::string::npos) end = lower_value.size();
    std::string item = lower_value.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item == lower_token) return true;
    start = end + 1;
  }
  return false;
}

/// The fields a browser needs to read a response of the CORS route from kAppOrigin.
void check_cors_fields(const HttpResponse& res) {
  BOOST_TEST(res.header("Access-Control-Allow-Origin").value_or("") == kAppOrigin, describe(res));
  BOOST_TEST(res.header_values("Access-Control-Allow-Origin").size() == 1u, describe(res));
  BOOST_TEST(lists(res, "Access-Control-Expose-Headers", "Idempotent-Replayed"), describe(res));
  BOOST_TEST(lists(res, "Access-Control-Expose-Headers", "Location"), describe(res));
  BOOST_TEST(lists(res, "Vary", "Origin"), describe(res));
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C57_a_preflight_is_answered_by_the_gateway_and_never_forwarded) {
  TestUpstream upstream;
  Gateway gateway(cors_gateway(upstream, unique_route("c57_pf"), unique_route("c57_plain")));

  const HttpResponse allowed = gateway.send(preflight("/p/orders", kAppOrigin));
  BOOST_TEST(allowed.status == 204u, gateway.explain(allowed));
  BOOST_TEST(allowed.header("Access-Control-Allow-Origin").value_or("") == kAppOrigin,
             describe(allowed));
  BOOST_TEST(lists(allowed, "Access-Control-Allow-Methods", "POST"), describe(allowed));
  // The key fields are always allowed request headers, every alias included.
  BOOST_TEST(lists(allowed, "Access-Control-Allow-Headers", "Idempotency-Key"), describe(allowed));
  BOOST_TEST(lists(allowed, "Access-Control-Allow-Headers", "X-Idempotency-Key"),
             describe(allowed));
  BOOST_TEST(lists(allowed, "Access-Control-Allow-Headers", "Content-Type"), describe(allowed));
  BOOST_TEST(allowed.header("Access-Control-Max-Age").value_or("") == "600", describe(allowed));
  BOOST_TEST(lists(allowed, "Vary", "Origin"), describe(allowed));
  BOOST_TEST(!allowed.header("Access-Control-Allow-Credentials").has_value());

  const HttpResponse other = gateway.send(preflight("/p/orders", "http://evil.test"));
  BOOST_TEST(other.status == 204u, describe(other));
  BOOST_TEST(!other.header("Access-Control-Allow-Origin").has_value(), describe(other));
  BOOST_TEST(!other.header("Access-Control-Allow-Headers").has_value(), describe(other));
  BOOST_TEST(upstream.total() == 0u, "a preflight reached the upstream");
}

BOOST_AUTO_TEST_CASE(spec_C57_every_answer_of_the_route_carries_the_cors_fields) {
  TestUpstream upstream;
  // An upstream that says something of its own about CORS is overruled on a cors route.
  UpstreamReply own;
  own.headers = {{"Content-Type", "application/json"},
                 {"Location", "/p/orders/1"},
                 {"Access-Control-Allow-Origin", "*"}};
  UpstreamReply held = own;
  held.hold = true;
  upstream.on("/p/orders", {own});
  upstream.on("/p/slow", {held});
  const std::string name = unique_route("c57_fields");
  Gateway gateway(cors_gateway(upstream, name, unique_route("c57_plain")));
  const HeaderList from_app = {{"Origin", kAppOrigin}};
  const std::string key = unique_name("c57");

  const HttpResponse first = gateway.send(keyed_post("/p/orders", key, "{}", from_app));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  check_cors_fields(first);
  const HttpResponse replay = gateway.send(keyed_post("/p/orders", key, "{}", from_app));
  BOOST_TEST(replayed(replay), describe(replay));
  check_cors_fields(replay);
  // The gateway's own answers: missing key (400), mismatch (422), in flight (409).
  const HttpResponse missing = gateway.send(keyed_post("/p/orders", std::nullopt, "{}", from_app));
  BOOST_TEST(is_problem(missing, 400));
  check_cors_fields(missing);
  const HttpResponse mismatch =
      gateway.send(keyed_post("/p/orders", key, R"({"other":1})", from_app));
  BOOST_TEST(is_problem(mismatch, 422));
  check_cors_fields(mismatch);

  const std::string slow_key = unique_name("c57-slow");
  auto in_flight = std::async(std::launch::async, [&] {
    return gateway.send(keyed_post("/p/slow", slow_key, "{}", from_app));
  });
  BOOST_TEST_REQUIRE(upstream.wait_for("/p/slow", 1));
  const HttpResponse duplicate = gateway.send(keyed_post("/p/slow", slow_key, "{}", from_app));
  upstream.release();
  BOOST_TEST(is_problem(duplicate, 409));
  check_cors_fields(duplicate);
  BOOST_TEST(in_flight.get().status == 201u);

  // A page of another origin is answered, without anything that lets a browser read it.
  const HttpResponse other =
      gateway.send(keyed_post("/p/orders", key, "{}", {{"Origin", "http://evil.test"}}));
  BOOST_TEST(replayed(other), describe(other));
  BOOST_TEST(!other.header("Access-Control-Allow-Origin").has_value(), describe(other));
  BOOST_TEST(!other.header("Access-Control-Expose-Headers").has_value(), describe(other));
  BOOST_TEST(upstream.count("/p/orders") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C57_without_cors_preflights_and_cors_fields_pass_through) {
  TestUpstream upstream;
  UpstreamReply answer;
  answer.status = 204;
  answer.headers = {{"Access-Control-Allow-Origin", "https://upstream.test"},
                    {"Access-Control-Allow-Methods", "PUT"}};
  upstream.on("/plain/x", {answer});
  Gateway gateway(cors_gateway(upstream, unique_route("c57_pf"), unique_route("c57_plain")));

  // OPTIONS is never keyed: the required route forwards it without a key.
  const HttpResponse res = gateway.send(preflight("/plain/x", kAppOrigin));
  BOOST_TEST(res.status == 204u, gateway.explain(res));
  BOOST_TEST_REQUIRE(upstream.count("/plain/x") == 1u);
  const ReceivedRequest got = upstream.received("/plain/x").front();
  BOOST_TEST(got.value("Origin").value_or("") == kAppOrigin);
  BOOST_TEST(got.value("Access-Control-Request-Method").value_or("") == "POST");
  BOOST_TEST(res.header("Access-Control-Allow-Origin").value_or("") == "https://upstream.test",
             describe(res));
  BOOST_TEST(res.header("Access-Control-Allow-Methods").value_or("") == "PUT", describe(res));
  BOOST_TEST(!lists(res, "Vary", "Origin"), describe(res));
}
