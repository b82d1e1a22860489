// The gateway end to end (SPEC §3, §4): real `idemgate` processes in front of the example
// payment service or an in-test upstream, with Postgres and Redis from the environment. Each
// test carries the SPEC case it checks; a failing test logs the gateway's stderr tail.
#define BOOST_TEST_MODULE gateway_e2e
#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/test/unit_test.hpp>
#include <cctype>
#include <future>
#include <map>

#include "tests/e2e/gateway_fixture.hpp"

namespace {

namespace json = boost::json;
using namespace idemgate::test;
using namespace idemgate::test::e2e;

// -------------------------------------------------------------------------------------------
// Set-ups shared by several cases.

/// The payments route of conf/demo.yaml: POST /payments under `mode: required`.
RouteConfig payments_route(std::vector<std::string> key_scope = {}) {
  RouteConfig r;
  r.name = "payments";
  r.path_prefix = "/payments";
  r.upstream = "payments";
  r.match_methods = {"POST"};
  r.mode = "required";
  r.methods = {"POST"};
  r.key_scope_headers = std::move(key_scope);
  return r;
}

GatewayConfig payments_gateway(const PaymentService& service,
                               std::vector<std::string> key_scope = {}) {
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  config.routes = {payments_route(std::move(key_scope))};
  return config;
}

/// A route on `path_prefix` to the upstream `upstream`, with `mode`.
RouteConfig route(std::string name, std::string path_prefix, std::string upstream,
                  std::string mode) {
  RouteConfig r;
  r.name = std::move(name);
  r.path_prefix = std::move(path_prefix);
  r.upstream = std::move(upstream);
  r.mode = std::move(mode);
  return r;
}

/// The default reply (201, `{"path":…,"n":…}`) after `delay`.
UpstreamReply reply_after(std::chrono::milliseconds delay) {
  UpstreamReply reply;
  reply.delay = delay;
  return reply;
}

/// The default reply, held until TestUpstream::release().
UpstreamReply held_reply() {
  UpstreamReply reply;
  reply.hold = true;
  return reply;
}

/// A port with nothing listening: bound once by free_port() and released.
std::string refusing_address() {
  return kLoopback + ":" + std::to_string(free_port());
}

/// A request in raw bytes, for field values the client library would not write (non-ASCII,
/// control characters) and for ambiguous framing. Host and Content-Length are added unless
/// given.
std::string raw_request(const std::string& method, const std::string& target,
                        const std::vector<std::string>& fields, const std::string& body) {
  std::string raw = method + " " + target + " HTTP/1.1\r\n";
  bool host = false;
  bool framing = false;
  for (const auto& f : fields) {
    std::string lower = f.substr(0, f.find(':'));
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    host = host || lower == "host";
    framing = framing || lower == "content-length" || lower == "transfer-encoding";
    raw += f + "\r\n";
  }
  if (!host) raw += "Host: gateway.test\r\n";
  if (!framing) raw += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return raw + "\r\n" + body;
}

HttpResponse send_raw(const Gateway& gateway, const std::string& bytes) {
  auto connection = gateway.connect();
  connection->send_raw(bytes);
  return connection->read_response();
}

bool replayed(const HttpResponse& res) {
  return res.header("Idempotent-Replayed").value_or("") == "true";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string fields_text(const HeaderList& headers) {
  std::string out;
  for (const auto& [name, value] : headers) out += name + ": " + value + "\n";
  return out;
}

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string pg_dsn() {
  return require_env("IDEMGATE_PG_DSN");
}

/// The stored record of `id_hex`: status, body (as text), route; nullopt when there is none.
std::optional<std::vector<std::string>> record_row(Database& db, const std::string& id_hex) {
  return db.row(
      "SELECT status::text, convert_from(body, 'UTF8'), route, (expires_at > now())::text "
      "FROM idempotency_record WHERE id = decode($1, 'hex')",
      {id_hex});
}

}  // namespace

// -------------------------------------------------------------------------------------------
// §3 Proxying

BOOST_AUTO_TEST_CASE(spec_C01_unmatched_request_gets_404_problem_and_nothing_is_forwarded) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"orders", {upstream.address()}}};
  config.routes = {route("orders", "/orders", "orders", "off")};
  Gateway gateway(config);

  const HttpResponse get = gateway.send({"GET", "/elsewhere", {}, ""});
  BOOST_TEST(is_problem(get, 404));
  const HttpResponse post =
      gateway.send(keyed_post("/invoices/1", unique_name("key"), R"({"a":1})"));
  BOOST_TEST(is_problem(post, 404));
  BOOST_TEST(upstream.total() == 0u);

  // The route itself forwards: the 404s came from matching, not from a dead set-up.
  const HttpResponse routed = gateway.send({"GET", "/orders/7", {}, ""});
  BOOST_TEST(routed.status == 201u, describe(routed));
  BOOST_TEST(upstream.total() == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C02_hop_by_hop_fields_are_removed_and_forwarding_fields_added) {
  TestUpstream upstream;
  upstream.on("/echo", {{200,
                         {{"Content-Type", "text/plain"},
                          {"Connection", "X-Up-Hop"},
                          {"X-Up-Hop", "1"},
                          {"Keep-Alive", "timeout=30"},
                          {"Proxy-Authenticate", "Basic"},
                          {"Set-Cookie", "a=1"},
                          {"X-End", "1"},
                          {"Set-Cookie", "b=2"}},
                         "ok"}});
  GatewayConfig config;
  config.upstreams = {{"echo", {upstream.address()}}};
  config.routes = {route("echo", "/echo", "echo", "off")};
  Gateway gateway(config);

  HttpRequest request{"GET",
                      "/echo",
                      {{"Host", "shop.example:8443"},
                       {"Connection", "keep-alive, X-Hop"},
                       {"X-Hop", "secret"},
                       {"Keep-Alive", "timeout=5"},
                       {"Proxy-Connection", "keep-alive"},
                       {"TE", "trailers"},
                       {"Trailer", "X-Checksum"},
                       {"Upgrade", "h2c"},
                       {"Proxy-Authorization", "Basic Zm9vOmJhcg=="},
                       {"X-Forwarded-For", "203.0.113.7"},
                       {"X-Multi", "a"},
                       {"Accept", "application/json"},
                       {"X-Multi", "b"},
                       {"X-Other", "z"},
                       {"X-Multi", "c"}},
                      ""};
  const HttpResponse res = gateway.send(request);
  BOOST_TEST_REQUIRE(res.status == 200u, describe(res));
  BOOST_TEST_REQUIRE(upstream.count("/echo") == 1u);
  const ReceivedRequest got = upstream.received("/echo").front();

  for (const char* name : {"X-Hop", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade",
                           "Proxy-Authorization"})
    BOOST_TEST(!got.value(name).has_value(), name << " reached the upstream");
  // The gateway may send its own Connection field to the upstream, never the client's.
  for (const auto& value : got.values("Connection"))
    BOOST_TEST(value.find("X-Hop") == std::string::npos, "Connection: " << value);

  BOOST_TEST(got.values("Host") == std::vector<std::string>{"shop.example:8443"});
  BOOST_TEST(got.value("X-Forwarded-For").value_or("") == "203.0.113.7, 127.0.0.1");
  BOOST_TEST(got.value("X-Forwarded-Proto").value_or("") == "http");
  BOOST_TEST(got.value("X-Forwarded-Host").value_or("") == "shop.example:8443");
  BOOST_TEST(!got.value("Via").value_or("").empty());
  // Repeated fields keep their order; the order between different names carries no meaning
  // (RFC 9110 §5.3), and HTTP libraries group equal names.
  BOOST_TEST((got.values("X-Multi") == std::vector<std::string>{"a", "b", "c"}),
             "the upstream received:\n"
                 << fields_text(got.headers));
  BOOST_TEST(got.values("Accept") == std::vector<std::string>{"application/json"});
  BOOST_TEST(got.values("X-Other") == std::vector<std::string>{"z"});

  // And towards the client.
  for (const char* name : {"X-Up-Hop", "Keep-Alive", "Proxy-Authenticate"})
    BOOST_TEST(!res.header(name).has_value(), name << " reached the client: " << describe(res));
  BOOST_TEST((res.header_values("Set-Cookie") == std::vector<std::string>{"a=1", "b=2"}));
  BOOST_TEST(res.header("X-End").value_or("") == "1");
  BOOST_TEST(res.body == "ok");
}

BOOST_AUTO_TEST_CASE(spec_C02_a_keyed_request_reaches_the_upstream_with_the_forwarding_fields) {
  TestUpstream upstream;
  upstream.on("/keyed", {{201, {{"Content-Type", "text/plain"}}, "made"}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("keyed", "/keyed", "up", "required")};
  Gateway gateway(config);

  const std::string key = unique_name("c02-keyed");
  const HttpResponse first = gateway.send(
      keyed_post("/keyed", key, "{}", {{"Host", "shop.example"}, {"Via", "1.1 edge"}}));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  BOOST_TEST_REQUIRE(upstream.count("/keyed") == 1u);
  const ReceivedRequest got = upstream.received("/keyed").front();
  BOOST_TEST(got.value("X-Forwarded-For").value_or("") == "127.0.0.1");
  BOOST_TEST(got.value("X-Forwarded-Proto").value_or("") == "http");
  BOOST_TEST(got.value("X-Forwarded-Host").value_or("") == "shop.example");
  BOOST_TEST(got.value("Via").value_or("").starts_with("1.1 edge, "),
             "the upstream received:\n"
                 << fields_text(got.headers));
  const std::string id = got.value("X-Request-Id").value_or("");
  BOOST_TEST(!id.empty());
  BOOST_TEST(first.header("X-Request-Id").value_or("") == id);

  // The retry is answered without the upstream, under its own request id.
  const HttpResponse retry = gateway.send(keyed_post("/keyed", key, "{}"));
  BOOST_TEST(retry.status == 201u, describe(retry));
  BOOST_TEST(replayed(retry), describe(retry));
  BOOST_TEST(!retry.header("X-Request-Id").value_or("").empty());
  BOOST_TEST(retry.header("X-Request-Id").value_or("") != id);
  BOOST_TEST(upstream.count("/keyed") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C32_a_fingerprint_over_the_generated_request_id_sees_the_id) {
  // A configuration the loader warns about: the gateway generates a new id for each request, so
  // a retry's fingerprint differs and the retry is a mismatch, as the warning says.
  TestUpstream upstream;
  upstream.on("/keyed", {{201, {{"Content-Type", "text/plain"}}, "made"}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  RouteConfig keyed = route("keyed", "/keyed", "up", "required");
  keyed.extra = {"fingerprint: { headers: [X-Request-Id] }"};
  config.routes = {keyed};
  Gateway gateway(config);

  const std::string key = unique_name("c32-id");
  const HttpResponse first = gateway.send(keyed_post("/keyed", key, "{}"));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  const HttpResponse retry = gateway.send(keyed_post("/keyed", key, "{}"));
  BOOST_TEST(is_problem(retry, 422), describe(retry));
  // With the id repeated by the client, the fingerprints agree.
  const std::string other = unique_name("c32-same");
  const HttpResponse a =
      gateway.send(keyed_post("/keyed", other, "{}", {{"X-Request-Id", "req-c32-1"}}));
  BOOST_TEST_REQUIRE(a.status == 201u, gateway.explain(a));
  const HttpResponse b =
      gateway.send(keyed_post("/keyed", other, "{}", {{"X-Request-Id", "req-c32-1"}}));
  BOOST_TEST(replayed(b), describe(b));
  BOOST_TEST(upstream.count("/keyed") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C04_oversized_body_413_and_header_431_forward_nothing_store_nothing) {
  TestUpstream upstream;
  GatewayConfig config;
  config.limits = "{ max_request_body: 1KiB, max_header_bytes: 8KiB, drain_timeout: 2s }";
  config.upstreams = {{"pay", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "pay", "required")};
  Gateway gateway(config);
  Database db(pg_dsn());
  RedisClient redis;

  const std::string big_key = unique_name("c04-body");
  const HttpResponse too_big = gateway.send(keyed_post("/pay", big_key, std::string(1025, 'x')));
  BOOST_TEST(is_problem(too_big, 413));

  const std::string long_key(10 * 1024, 'k');
  const HttpResponse too_long = gateway.send(keyed_post("/pay", long_key, "{}"));
  BOOST_TEST(is_problem(too_long, 431));

  BOOST_TEST(upstream.total() == 0u);
  for (const auto& key : {big_key, long_key}) {
    const std::string id = record_id_hex("pay", key);
    BOOST_TEST(!record_row(db, id).has_value(), "a record exists for a rejected request");
    BOOST_TEST(!redis.exists(lock_key(id)), "a lock exists for a rejected request");
  }

  // A body of exactly the limit is accepted: the 413 came from the limit, not the route.
  const HttpResponse at_limit =
      gateway.send(keyed_post("/pay", unique_name("c04-ok"), std::string(1024, 'x')));
  BOOST_TEST(at_limit.status == 201u, describe(at_limit));
  BOOST_TEST(upstream.total() == 1u);
}

BOOST_AUTO_TEST_CASE(
    spec_C05_refused_or_reset_upstream_502_and_slow_upstream_504_keep_the_connection) {
  TestUpstream upstream;
  // Answers after a minute: far beyond the route's request_timeout.
  upstream.on("/slow", {reply_after(std::chrono::minutes(1))});
  UpstreamReply reset;
  reset.reset = true;
  upstream.on("/reset", {reset});
  GatewayConfig config;
  config.upstreams = {{"dead", {refusing_address()}},
                      {"slow", {upstream.address()}, "1s", "300ms"},
                      {"live", {upstream.address()}}};
  config.routes = {route("dead", "/dead", "dead", "off"), route("slow", "/slow", "slow", "off"),
                   route("live", "/live", "live", "off"), route("reset", "/reset", "live", "off")};
  Gateway gateway(config);

  auto connection = gateway.connect();
  const HttpResponse refused = connection->request(keyed_post("/dead", std::nullopt, "{}"));
  BOOST_TEST(is_problem(refused, 502));
  BOOST_TEST(refused.keep_alive);

  const HttpResponse reset_res = connection->request(keyed_post("/reset", std::nullopt, "{}"));
  BOOST_TEST(is_problem(reset_res, 502));
  BOOST_TEST(reset_res.keep_alive);
  BOOST_TEST(upstream.count("/reset") >= 1u);

  const HttpResponse slow = connection->request(keyed_post("/slow", std::nullopt, "{}"));
  BOOST_TEST(is_problem(slow, 504));
  BOOST_TEST(slow.keep_alive);
  BOOST_TEST(upstream.count("/slow") == 1u);

  // The same client connection still serves requests.
  BOOST_TEST_REQUIRE(connection->is_open());
  const HttpResponse live = connection->request({"GET", "/live", {}, ""});
  BOOST_TEST(live.status == 201u, describe(live));
  BOOST_TEST(upstream.count("/live") == 1u);
}

// -------------------------------------------------------------------------------------------
// §4 The Idempotency-Key contract

BOOST_AUTO_TEST_CASE(spec_C10_required_route_without_key_gets_400_and_upstream_is_not_called) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"pay", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "pay", "required")};
  Gateway gateway(config);

  const HttpResponse res = gateway.send(keyed_post("/pay", std::nullopt, R"({"a":1})"));
  BOOST_TEST_REQUIRE(is_problem(res, 400));
  const std::string detail(json::parse(res.body).at("detail").as_string());
  BOOST_TEST(detail.find("Idempotency-Key") != std::string::npos, detail);
  BOOST_TEST(upstream.count("/pay") == 0u);

  const HttpResponse keyed = gateway.send(keyed_post("/pay", unique_name("c10"), R"({"a":1})"));
  BOOST_TEST(keyed.status == 201u, describe(keyed));
  BOOST_TEST(upstream.count("/pay") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C10_a_required_route_spelled_another_way_still_requires_its_key) {
  // An upstream resolves `/%70ay`, `//pay` and `/x/../pay` to `/pay`: so does the router, and
  // none of them reaches the catch-all route unprotected.
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "up", "required"), route("rest", "/", "up", "off")};
  Gateway gateway(config);

  for (const std::string path : {"/%70ay", "//pay", "/x/../pay", "/x/%2E%2e/pay"}) {
    const HttpResponse res = gateway.send(keyed_post(path, std::nullopt, R"({"a":1})"));
    BOOST_TEST(is_problem(res, 400), path << ": " << describe(res));
    BOOST_TEST(upstream.count(path) == 0u, path);
  }
  const std::string key = unique_name("c10-spelled");
  const HttpResponse first = gateway.send(keyed_post("/%70ay", key, R"({"a":1})"));
  const HttpResponse again = gateway.send(keyed_post("/%70ay", key, R"({"a":1})"));
  BOOST_TEST(first.status == 201u, describe(first));
  BOOST_TEST(replayed(again), describe(again));
  BOOST_TEST(upstream.count("/%70ay") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C11_optional_route_forwards_keyless_requests_and_off_forwards_all) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("opt", "/opt", "up", "optional"), route("off", "/off", "up", "off")};
  Gateway gateway(config);

  // optional, no key: every request executes.
  for (std::size_t n = 1; n <= 2; ++n) {
    const HttpResponse res = gateway.send(keyed_post("/opt", std::nullopt, R"({"a":1})"));
    BOOST_TEST(res.status == 201u, describe(res));
    BOOST_TEST(!res.header("Idempotent-Replayed").has_value(), describe(res));
    BOOST_TEST(upstream.count("/opt") == n);
  }
  // off: even a keyed retry executes.
  const std::string key = unique_name("c11");
  for (std::size_t n = 1; n <= 2; ++n) {
    const HttpResponse res = gateway.send(keyed_post("/off", key, R"({"a":1})"));
    BOOST_TEST(res.status == 201u, describe(res));
    BOOST_TEST(!res.header("Idempotent-Replayed").has_value(), describe(res));
    BOOST_TEST(upstream.count("/off") == n);
  }
  // optional with a key: the contract applies.
  const std::string opt_key = unique_name("c11-opt");
  const HttpResponse first = gateway.send(keyed_post("/opt", opt_key, R"({"a":1})"));
  const HttpResponse again = gateway.send(keyed_post("/opt", opt_key, R"({"a":1})"));
  BOOST_TEST(first.status == 201u, describe(first));
  BOOST_TEST(replayed(again), describe(again));
  BOOST_TEST(upstream.count("/opt") == 3u);
}

BOOST_AUTO_TEST_CASE(spec_C12_get_with_a_key_is_forwarded_untouched) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"res", {upstream.address()}}};
  RouteConfig r = route("res", "/res", "res", "required");
  r.methods = {"POST"};
  config.routes = {r};
  Gateway gateway(config);
  Database db(pg_dsn());

  const std::string key = unique_name("c12");
  for (std::size_t n = 1; n <= 2; ++n) {
    const HttpResponse res = gateway.send({"GET", "/res/1", {{"Idempotency-Key", key}}, ""});
    BOOST_TEST(res.status == 201u, describe(res));
    BOOST_TEST(!res.header("Idempotent-Replayed").has_value(), describe(res));
    BOOST_TEST(json::parse(res.body).at("n").as_int64() == static_cast<std::int64_t>(n));
  }
  BOOST_TEST_REQUIRE(upstream.count("/res/1") == 2u);
  for (const auto& got : upstream.received("/res/1"))
    BOOST_TEST(got.values("Idempotency-Key") == std::vector<std::string>{key});
  BOOST_TEST(!record_row(db, record_id_hex("res", key)).has_value());

  // Not even a missing key stops a method outside the contract.
  const HttpResponse keyless = gateway.send({"GET", "/res/2", {}, ""});
  BOOST_TEST(keyless.status == 201u, describe(keyless));
}

BOOST_AUTO_TEST_CASE(spec_C13_invalid_keys_get_400_and_upstream_is_not_called) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"pay", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "pay", "required")};
  Gateway gateway(config);

  const std::string u = unique_name("c13");
  const std::map<std::string, std::vector<std::string>> cases = {
      {"empty", {"Idempotency-Key: "}},
      {"empty sf-string", {"Idempotency-Key: \"\""}},
      {"256 characters", {"Idempotency-Key: " + std::string(256, 'a')}},
      {"non-ASCII", {"Idempotency-Key: cl\xC3\xA9-" + u}},
      {"control character", {"Idempotency-Key: a\x01" + u}},
      {"two fields", {"Idempotency-Key: a-" + u, "Idempotency-Key: b-" + u}},
      {"list", {"Idempotency-Key: \"a-" + u + "\", \"b-" + u + "\""}},
  };
  for (const auto& [name, fields] : cases) {
    std::vector<std::string> all = {"Content-Type: application/json"};
    all.insert(all.end(), fields.begin(), fields.end());
    const HttpResponse res = send_raw(gateway, raw_request("POST", "/pay", all, R"({"a":1})"));
    BOOST_TEST(is_problem(res, 400), name);
  }
  BOOST_TEST(upstream.count("/pay") == 0u);

  // The boundaries that are valid: 255 characters, an sf-string with escapes.
  const HttpResponse longest =
      gateway.send(keyed_post("/pay", std::string(255 - u.size(), 'a') + u, "{}"));
  BOOST_TEST(longest.status == 201u, describe(longest));
  const HttpResponse escaped = gateway.send(keyed_post("/pay", "\"a\\\"b\\\\c-" + u + "\"", "{}"));
  BOOST_TEST(escaped.status == 201u, describe(escaped));
  BOOST_TEST(upstream.count("/pay") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C14_passthrough_forwards_the_key_field_unchanged) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"pay", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "pay", "required")};
  Gateway gateway(config);

  const std::string bare = unique_name("c14");
  const std::string quoted = "\"" + unique_name("c14") + "\"";
  for (const auto& key : {bare, quoted}) {
    const HttpResponse res = gateway.send(keyed_post("/pay", key, "{}"));
    BOOST_TEST(res.status == 201u, describe(res));
  }
  const auto got = upstream.received("/pay");
  BOOST_TEST_REQUIRE(got.size() == 2u);
  BOOST_TEST(got[0].values("Idempotency-Key") == std::vector<std::string>{bare});
  BOOST_TEST(got[1].values("Idempotency-Key") == std::vector<std::string>{quoted});
}

BOOST_AUTO_TEST_CASE(spec_C15_first_request_executes_once_and_its_record_is_committed) {
  PaymentService service;
  Gateway gateway(payments_gateway(service));
  Database db(pg_dsn());
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c15");
  const HttpResponse res = gateway.send(keyed_post("/payments", key, payment_body(key)));
  BOOST_TEST_REQUIRE(res.status == 201u, gateway.explain(res));
  BOOST_TEST(!res.header("Idempotent-Replayed").has_value());
  const std::int64_t id = json::parse(res.body).at("id").as_int64();
  BOOST_TEST(res.header("Location").value_or("") == "/payments/" + std::to_string(id));
  BOOST_TEST(service.counter("payment_posts") == posts + 1);
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);

  // The response came after the commit: the row is there now, with that response.
  const auto row = record_row(db, record_id_hex("payments", key));
  BOOST_TEST_REQUIRE(row.has_value(), "no idempotency_record row for the key");
  BOOST_TEST((*row)[0] == "201");
  BOOST_TEST((*row)[1] == res.body);
  BOOST_TEST((*row)[2] == "payments");
  BOOST_TEST((*row)[3] == "true", "expires_at is not in the future");
}

BOOST_AUTO_TEST_CASE(spec_C16_retry_replays_status_body_and_location_without_the_upstream) {
  PaymentService service;
  Gateway gateway(payments_gateway(service));

  const std::string key = unique_name("c16");
  const std::string body = payment_body(key);
  const HttpResponse first = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  for (int attempt = 0; attempt < 2; ++attempt) {
    const HttpResponse retry = gateway.send(keyed_post("/payments", key, body));
    BOOST_TEST(retry.status == first.status, describe(retry));
    BOOST_TEST(retry.body == first.body);
    BOOST_TEST(retry.header("Location").value_or("<none>") ==
               first.header("Location").value_or("<none>"));
    BOOST_TEST(retry.header("Content-Type").value_or("<none>") ==
               first.header("Content-Type").value_or("<none>"));
    BOOST_TEST(retry.header_values("Idempotent-Replayed") == std::vector<std::string>{"true"},
               describe(retry));
    BOOST_TEST(retry.header("Content-Length").value_or("") == std::to_string(retry.body.size()));
    BOOST_TEST(retry.header("Date").has_value());
  }
  BOOST_TEST(service.counter("payment_posts") == posts);
  BOOST_TEST(service.counter("payments_inserted") == inserted);

  // A client cannot make a first response look like a replay.
  const std::string fresh = unique_name("c16-fresh");
  const HttpResponse forged = gateway.send(
      keyed_post("/payments", fresh, payment_body(fresh), {{"Idempotent-Replayed", "true"}}));
  BOOST_TEST(forged.status == 201u, describe(forged));
  BOOST_TEST(!forged.header("Idempotent-Replayed").has_value(), describe(forged));
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);
}

BOOST_AUTO_TEST_CASE(spec_C17_same_key_with_another_body_gets_422_and_the_original_replays) {
  PaymentService service;
  Gateway gateway(payments_gateway(service));
  Database db(pg_dsn());

  const std::string key = unique_name("c17");
  const std::string body = payment_body(key, "10.50");
  const HttpResponse first = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  const auto posts = service.counter("payment_posts");

  const HttpResponse other = gateway.send(keyed_post("/payments", key, payment_body(key, "99.00")));
  BOOST_TEST(is_problem(other, 422));
  BOOST_TEST(service.counter("payment_posts") == posts);

  const HttpResponse original = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST(original.status == 201u, describe(original));
  BOOST_TEST(replayed(original), describe(original));
  BOOST_TEST(original.body == first.body);
  const auto row = record_row(db, record_id_hex("payments", key));
  BOOST_TEST_REQUIRE(row.has_value());
  BOOST_TEST((*row)[1] == first.body);
  BOOST_TEST(service.counter("payment_posts") == posts);
}

BOOST_AUTO_TEST_CASE(spec_C18_duplicate_while_the_first_runs_gets_409_with_retry_after) {
  PaymentService service({.delay_ms = 500});
  Gateway gateway(payments_gateway(service));
  const auto posts = service.counter("payment_posts");

  const std::string key = unique_name("c18");
  const std::string body = payment_body(key);
  auto first = std::async(std::launch::async,
                          [&] { return gateway.send(keyed_post("/payments", key, body)); });
  BOOST_TEST_REQUIRE(service.wait_for_counter("payment_posts", posts + 1),
                     "the first request never reached the payment service\n"
                         << gateway.diagnostics());

  const HttpResponse duplicate = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST(is_problem(duplicate, 409));
  BOOST_TEST(duplicate.header("Retry-After").has_value(), describe(duplicate));
  BOOST_TEST(ends_with(problem_type(duplicate), "/request-in-flight"), describe(duplicate));

  const HttpResponse original = first.get();
  BOOST_TEST(original.status == 201u, describe(original));
  BOOST_TEST(!replayed(original));
  BOOST_TEST(service.counter("payment_posts") == posts + 1);

  // Once the first has finished, the same retry is a replay.
  const HttpResponse later = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST(replayed(later), describe(later));
  BOOST_TEST(later.body == original.body);
}

BOOST_AUTO_TEST_CASE(spec_C19_fifty_concurrent_identical_posts_over_two_gateways_execute_once) {
  PaymentService service({.delay_ms = 300});
  Gateway gateway(payments_gateway(service), 2);
  Database payments(require_env("IDEMGATE_PAYMENTS_DSN"));
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c19");
  const std::string body = payment_body(key, "42.42");
  constexpr std::size_t kClients = 50;
  const auto results = run_concurrently(kClients, [&](std::size_t i) {
    return gateway.send(keyed_post("/payments", key, body), static_cast<int>(i % 2));
  });

  std::vector<const HttpResponse*> executed;
  std::vector<const HttpResponse*> replays;
  std::size_t in_flight = 0;
  for (const auto& r : results) {
    BOOST_TEST_REQUIRE(r.error.empty(), r.error);
    const HttpResponse& res = r.response;
    if (res.status == 201u && !replayed(res)) {
      executed.push_back(&res);
    } else if (res.status == 201u) {
      replays.push_back(&res);
    } else {
      BOOST_TEST(is_problem(res, 409));
      BOOST_TEST(ends_with(problem_type(res), "/request-in-flight"), describe(res));
      ++in_flight;
    }
  }
  BOOST_TEST_MESSAGE("executed " << executed.size() << ", replayed " << replays.size()
                                 << ", in flight " << in_flight);
  BOOST_TEST_REQUIRE(executed.size() == 1u);
  for (const auto* r : replays) BOOST_TEST(r->body == executed.front()->body);

  BOOST_TEST(service.counter("payment_posts") == posts + 1);
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);
  BOOST_TEST(
      payments.scalar("SELECT count(*) FROM payment WHERE external_payment_id = $1", {key}) == "1");
}

BOOST_AUTO_TEST_CASE(spec_C20_equal_keys_of_different_clients_execute_independently) {
  PaymentService service;
  Gateway gateway(payments_gateway(service, {"Authorization"}));
  Database db(pg_dsn());
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c20");
  struct Client {
    std::string authorization;
    std::string body;
    HttpResponse first;
  };
  std::vector<Client> clients = {{"Bearer alice-" + key, payment_body(key + "-alice"), {}},
                                 {"Bearer bob-" + key, payment_body(key + "-bob"), {}}};
  for (auto& c : clients) {
    c.first =
        gateway.send(keyed_post("/payments", key, c.body, {{"Authorization", c.authorization}}));
    BOOST_TEST_REQUIRE(c.first.status == 201u, gateway.explain(c.first));
    BOOST_TEST(!replayed(c.first), describe(c.first));
  }
  BOOST_TEST(json::parse(clients[0].first.body).at("id") !=
             json::parse(clients[1].first.body).at("id"));
  BOOST_TEST(service.counter("payments_inserted") == inserted + 2);

  // Each retry replays its own client's answer.
  for (const auto& c : clients) {
    const HttpResponse retry =
        gateway.send(keyed_post("/payments", key, c.body, {{"Authorization", c.authorization}}));
    BOOST_TEST(replayed(retry), describe(retry));
    BOOST_TEST(retry.body == c.first.body);
    const auto row =
        record_row(db, record_id_hex("payments", key, {{"Authorization", {c.authorization}}}));
    BOOST_TEST_REQUIRE(row.has_value(), "no record for " << c.authorization);
    BOOST_TEST((*row)[1] == c.first.body);
  }
}

BOOST_AUTO_TEST_CASE(spec_C21_unstored_statuses_and_unreached_upstream_let_the_retry_execute) {
  TestUpstream upstream;
  upstream.on("/charge", {{500, {{"Content-Type", "application/json"}}, R"({"error":"boom"})"},
                          UpstreamReply{}});
  upstream.on("/limited", {{429, {{"Retry-After", "7"}}, "slow down"}, UpstreamReply{}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}, {"dead", {refusing_address()}}};
  config.routes = {route("charge", "/charge", "up", "required"),
                   route("limited", "/limited", "up", "required"),
                   route("dead", "/dead", "dead", "required")};
  Gateway gateway(config);
  Database db(pg_dsn());
  RedisClient redis;

  struct Case {
    std::string path;
    unsigned status;
    std::string body;
  };
  for (const Case& c :
       {Case{"/charge", 500, R"({"error":"boom"})"}, Case{"/limited", 429, "slow down"}}) {
    BOOST_TEST_CONTEXT(c.path) {
      const std::string key = unique_name("c21");
      const std::string route_name = c.path.substr(1);
      // The upstream's error reaches the client unchanged (C09) and is not stored.
      const HttpResponse failed = gateway.send(keyed_post(c.path, key, "{}"));
      BOOST_TEST(failed.status == c.status, describe(failed));
      BOOST_TEST(failed.body == c.body);
      BOOST_TEST(!record_row(db, record_id_hex(route_name, key)).has_value());
      BOOST_TEST(!redis.exists(lock_key(record_id_hex(route_name, key))));

      const HttpResponse retried = gateway.send(keyed_post(c.path, key, "{}"));
      BOOST_TEST(retried.status == 201u, describe(retried));
      BOOST_TEST(!replayed(retried), describe(retried));
      BOOST_TEST(upstream.count(c.path) == 2u);

      const HttpResponse again = gateway.send(keyed_post(c.path, key, "{}"));
      BOOST_TEST(replayed(again), describe(again));
      BOOST_TEST(again.body == retried.body);
      BOOST_TEST(upstream.count(c.path) == 2u);
    }
  }

  // Never reached: 502, and the key is free at once.
  const std::string key = unique_name("c21-dead");
  for (int attempt = 0; attempt < 2; ++attempt) {
    const HttpResponse res = gateway.send(keyed_post("/dead", key, "{}"));
    BOOST_TEST(is_problem(res, 502), "attempt " << attempt);
  }
  BOOST_TEST(!redis.exists(lock_key(record_id_hex("dead", key))));
  BOOST_TEST(!record_row(db, record_id_hex("dead", key)).has_value());
}

BOOST_AUTO_TEST_CASE(spec_C28_quoted_and_bare_keys_are_equal_and_case_matters) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"pay", {upstream.address()}}};
  config.routes = {route("pay", "/pay", "pay", "required")};
  Gateway gateway(config);

  const std::string key = unique_name("c28");
  const HttpResponse quoted = gateway.send(keyed_post("/pay", "\"" + key + "\"", "{}"));
  BOOST_TEST_REQUIRE(quoted.status == 201u, gateway.explain(quoted));
  BOOST_TEST(!replayed(quoted));

  const HttpResponse bare = gateway.send(keyed_post("/pay", key, "{}"));
  BOOST_TEST(replayed(bare), describe(bare));
  BOOST_TEST(bare.body == quoted.body);

  HttpRequest lower_name = keyed_post("/pay", std::nullopt, "{}", {{"idempotency-key", key}});
  const HttpResponse lower = gateway.send(lower_name);
  BOOST_TEST(replayed(lower), describe(lower));
  BOOST_TEST(lower.body == quoted.body);
  BOOST_TEST(upstream.count("/pay") == 1u);

  const HttpResponse other_case = gateway.send(keyed_post("/pay", upper(key), "{}"));
  BOOST_TEST(other_case.status == 201u, describe(other_case));
  BOOST_TEST(!replayed(other_case), describe(other_case));
  BOOST_TEST(upstream.count("/pay") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C33_every_gateway_error_is_problem_json) {
  TestUpstream upstream;
  upstream.on("/held", {held_reply()});
  upstream.on("/slow", {reply_after(std::chrono::minutes(1))});
  GatewayConfig config;
  config.limits = "{ max_request_body: 1KiB, max_header_bytes: 8KiB, drain_timeout: 2s }";
  config.upstreams = {{"up", {upstream.address()}},
                      {"slow", {upstream.address()}, "1s", "300ms"},
                      {"dead", {refusing_address()}}};
  config.routes = {route("pay", "/pay", "up", "required"), route("held", "/held", "up", "required"),
                   route("slow", "/slow", "slow", "off"), route("dead", "/dead", "dead", "off")};
  Gateway gateway(config);

  auto check = [&](const std::string& name, const HttpResponse& res, unsigned status) {
    BOOST_TEST(is_problem(res, status), name);
  };
  check("no route", gateway.send({"GET", "/nowhere", {}, ""}), 404);
  check("missing key", gateway.send(keyed_post("/pay", std::nullopt, "{}")), 400);
  check("invalid key", gateway.send(keyed_post("/pay", std::string(256, 'a'), "{}")), 400);
  check("body too large",
        gateway.send(keyed_post("/pay", unique_name("c33"), std::string(2048, 'x'))), 413);
  check("header too large", gateway.send(keyed_post("/pay", std::string(10 * 1024, 'k'), "{}")),
        431);
  check("ambiguous framing",
        send_raw(gateway, raw_request("POST", "/pay",
                                      {"Idempotency-Key: " + unique_name("c33"),
                                       "Content-Length: 2", "Transfer-Encoding: chunked"},
                                      "2\r\n{}\r\n0\r\n\r\n")),
        400);

  const std::string key = unique_name("c33-mismatch");
  BOOST_TEST(gateway.send(keyed_post("/pay", key, R"({"a":1})")).status == 201u);
  check("mismatch", gateway.send(keyed_post("/pay", key, R"({"a":2})")), 422);

  const std::string held_key = unique_name("c33-held");
  auto held = std::async(std::launch::async,
                         [&] { return gateway.send(keyed_post("/held", held_key, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/held", 1));
  check("in flight", gateway.send(keyed_post("/held", held_key, "{}")), 409);
  upstream.release();
  BOOST_TEST(held.get().status == 201u);

  check("upstream refused", gateway.send({"GET", "/dead", {}, ""}), 502);
  check("upstream timeout", gateway.send({"GET", "/slow", {}, ""}), 504);
}

BOOST_AUTO_TEST_CASE(spec_C36_after_a_lost_lock_both_clients_get_the_first_stored_response) {
  PaymentService service({.delay_ms = 800});
  Gateway gateway(payments_gateway(service));
  Database db(pg_dsn());
  RedisClient redis;
  Database payments(require_env("IDEMGATE_PAYMENTS_DSN"));
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c36");
  const std::string body = payment_body(key);
  const std::string id = record_id_hex("payments", key);
  auto a = std::async(std::launch::async,
                      [&] { return gateway.send(keyed_post("/payments", key, body)); });
  BOOST_TEST_REQUIRE(service.wait_for_counter("payment_posts", posts + 1),
                     "request A never reached the payment service\n"
                         << gateway.diagnostics());
  // The lock is lost, as in a Redis failover.
  BOOST_TEST_REQUIRE(redis.del(lock_key(id)) == 1, "A's lock was not in Redis");

  const HttpResponse b = gateway.send(keyed_post("/payments", key, body));
  const HttpResponse a_res = a.get();
  BOOST_TEST_MESSAGE("A: " << a_res.status << (replayed(a_res) ? " replayed" : "")
                           << ", B: " << b.status << (replayed(b) ? " replayed" : ""));

  // Both executed upstream; the payment service's UNIQUE kept one payment.
  BOOST_TEST(service.counter("payment_posts") == posts + 2);
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);

  // The first committed record wins: exactly one answer is a replay, and both are that record.
  // Usually A's 201 commits first; when B's answer (the service's 200 for the existing payment)
  // reaches its gateway first, B's is the stored one. Either is the same payment.
  BOOST_TEST((replayed(a_res) != replayed(b)), describe(a_res) << "\n---\n" << describe(b));
  const HttpResponse& first = replayed(a_res) ? b : a_res;
  BOOST_TEST((first.status == 201u || first.status == 200u), describe(first));
  BOOST_TEST(
      json::parse(first.body).at("id").as_int64() ==
      std::stoll(payments.scalar("SELECT id FROM payment WHERE external_payment_id = $1", {key})));
  BOOST_TEST(a_res.status == b.status);
  BOOST_TEST(a_res.body == b.body);
  BOOST_TEST(a_res.header("Location").value_or("<none>") ==
             b.header("Location").value_or("<none>"));
  const auto row = record_row(db, id);
  BOOST_TEST_REQUIRE(row.has_value());
  BOOST_TEST((*row)[0] == std::to_string(first.status));
  BOOST_TEST((*row)[1] == first.body);

  const std::string log = gateway.stderr_text();
  BOOST_TEST(log.find("duplicate execution") != std::string::npos, gateway.diagnostics());

  const HttpResponse later = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST(replayed(later), describe(later));
  BOOST_TEST(later.body == first.body);
  BOOST_TEST(service.counter("payment_posts") == posts + 2);
}
