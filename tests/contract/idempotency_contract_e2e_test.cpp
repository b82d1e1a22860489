// The Idempotency-Key contract end to end (SPEC §4): the cases that need a real gateway between
// a client and an upstream to be seen — what the upstream receives of the key (C14), what a
// replay carries (C16, C29), waiting duplicates (C18), unknown outcomes (C22), a client that
// goes away (C34), JSON fingerprints (C35) and hostile keys (C13).
#define BOOST_TEST_MODULE idempotency_contract_e2e
#include <boost/json/parse.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <ctime>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <thread>

#include "tests/contract/contract_support.hpp"

namespace {

namespace json = boost::json;
using namespace idemgate::test;
using namespace idemgate::test::contract;
using namespace std::chrono_literals;

/// A reply the in-test upstream holds until TestUpstream::release().
UpstreamReply held(unsigned status = 201) {
  UpstreamReply reply;
  reply.status = status;
  reply.hold = true;
  return reply;
}

/// A reply that reads the request and resets the connection without answering.
UpstreamReply reset_reply() {
  UpstreamReply reply;
  reply.reset = true;
  return reply;
}

/// True when `future` has no result yet. A duplicate that waits (C18 `concurrency: wait`) has
/// none while the first request is held; a rejecting gateway answers at once, so a short look
/// tells the two apart without making the outcome depend on it.
bool still_waiting(std::future<HttpResponse>& future) {
  return future.wait_for(300ms) == std::future_status::timeout;
}

/// An IMF-fixdate (RFC 9110 §5.6.7, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`) as a time point;
/// nullopt when `text` is not one.
std::optional<std::chrono::system_clock::time_point> parse_http_date(const std::string& text) {
  std::tm tm{};
  const char* end = ::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

/// The payments route of conf/demo.yaml with extra `idempotency` lines.
RouteConfig payments_route(std::vector<std::string> extra = {}) {
  RouteConfig r = route("payments", "/payments", "payments", "required", std::move(extra));
  r.match_methods = {"POST"};
  r.methods = {"POST"};
  return r;
}

}  // namespace

// -------------------------------------------------------------------------------------------
// C14 What the upstream sees of the key

BOOST_AUTO_TEST_CASE(spec_C14_rewrite_sends_a_scoped_hmac_and_strip_sends_no_key) {
  TestUpstream upstream;
  // The first execution is not stored (500), so the retry executes again and shows the value
  // the same scope and key produce a second time.
  upstream.on("/rw", {{500, {{"Content-Type", "application/json"}}, R"({"error":"retry"})"},
                      UpstreamReply{}});
  TempDir secrets;
  const std::string secret = "contract-suite-hmac-secret-0123456789abcdef";
  const std::string secret_file = (secrets.path() / "hmac.key").string();
  std::ofstream(secret_file) << secret << "\n";

  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  RouteConfig rewrite =
      route("rewrite", "/rw", "up", "required",
            {"upstream_key: rewrite", "upstream_key_secret_file: \"" + secret_file + "\""});
  rewrite.key_scope_headers = {"Authorization"};
  config.routes = {rewrite, route("strip", "/strip", "up", "required", {"upstream_key: strip"})};
  Gateway gateway(config);

  const std::string key = unique_name("c14");
  const HeaderList alice = {{"Authorization", "Bearer alice"}};
  const HeaderList bob = {{"Authorization", "Bearer bob"}};
  const HttpResponse failed = gateway.send(keyed_post("/rw", key, "{}", alice));
  BOOST_TEST_REQUIRE(failed.status == 500u, gateway.explain(failed));
  const HttpResponse executed = gateway.send(keyed_post("/rw", key, "{}", alice));
  BOOST_TEST(executed.status == 201u, describe(executed));
  BOOST_TEST(!replayed(executed));
  const HttpResponse other_client = gateway.send(keyed_post("/rw", key, "{}", bob));
  BOOST_TEST(other_client.status == 201u, describe(other_client));
  BOOST_TEST(!replayed(other_client));

  const auto got = upstream.received("/rw");
  BOOST_TEST_REQUIRE(got.size() == 3u);
  std::vector<std::string> seen;
  for (const auto& r : got) {
    const auto values = r.values("Idempotency-Key");
    BOOST_TEST_REQUIRE(values.size() == 1u, "the upstream got " << values.size() << " keys");
    BOOST_TEST(is_hex64(values.front()), values.front());
    BOOST_TEST(values.front() != key);
    seen.push_back(values.front());
  }
  BOOST_TEST(seen[0] == seen[1], "the same scope and key gave two upstream keys");
  BOOST_TEST(seen[0] != seen[2], "two clients' equal keys collide at the upstream");
  // The HMAC under the configured secret, without the file's final newline: a gateway that
  // ignored or misread the secret would send other values.
  BOOST_TEST(seen[0] ==
             rewritten_key(secret, "rewrite", key, {{"Authorization", {"Bearer alice"}}}));
  BOOST_TEST(seen[2] == rewritten_key(secret, "rewrite", key, {{"Authorization", {"Bearer bob"}}}));

  // Dedup itself still runs on the client's key.
  const HttpResponse replay = gateway.send(keyed_post("/rw", key, "{}", alice));
  BOOST_TEST(replayed(replay), describe(replay));
  BOOST_TEST(replay.body == executed.body);
  BOOST_TEST(upstream.count("/rw") == 3u);

  const std::string strip_key = unique_name("c14-strip");
  const HttpResponse stripped = gateway.send(keyed_post("/strip", strip_key, "{}"));
  BOOST_TEST(stripped.status == 201u, describe(stripped));
  BOOST_TEST_REQUIRE(upstream.count("/strip") == 1u);
  const ReceivedRequest strip_got = upstream.received("/strip").front();
  BOOST_TEST(!strip_got.value("Idempotency-Key").has_value(),
             "the upstream got Idempotency-Key: " << *strip_got.value("Idempotency-Key"));
  const HttpResponse strip_replay = gateway.send(keyed_post("/strip", strip_key, "{}"));
  BOOST_TEST(replayed(strip_replay), describe(strip_replay));
  BOOST_TEST(upstream.count("/strip") == 1u);
}

// -------------------------------------------------------------------------------------------
// C16 What a replay carries

BOOST_AUTO_TEST_CASE(spec_C16_repeated_set_cookie_location_and_etag_replay_in_order) {
  TestUpstream upstream;
  upstream.on("/orders", {{201,
                           {{"Content-Type", "application/json"},
                            {"Set-Cookie", "a=1; Path=/"},
                            {"Location", "/orders/7"},
                            {"Set-Cookie", "b=2"},
                            {"ETag", "\"v1\""},
                            {"Set-Cookie", "c=3; HttpOnly"}},
                           R"({"id":7})"}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("orders", "/orders", "up")};
  Gateway gateway(config);

  const std::string key = unique_name("c16-cookies");
  const HttpResponse first = gateway.send(keyed_post("/orders", key, "{}"));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  const HttpResponse replay = gateway.send(keyed_post("/orders", key, "{}"));
  BOOST_TEST_REQUIRE(replayed(replay), describe(replay));
  BOOST_TEST(upstream.count("/orders") == 1u);

  const std::vector<std::string> cookies = {"a=1; Path=/", "b=2", "c=3; HttpOnly"};
  BOOST_TEST(first.header_values("Set-Cookie") == cookies, describe(first));
  BOOST_TEST(replay.header_values("Set-Cookie") == cookies, describe(replay));
  BOOST_TEST(replay.header_values("Location") == std::vector<std::string>{"/orders/7"});
  BOOST_TEST(replay.header_values("ETag") == std::vector<std::string>{"\"v1\""});
  BOOST_TEST(replay.header("Content-Type").value_or("") == "application/json");
  BOOST_TEST(replay.header_count("Date") == 1u, describe(replay));
  BOOST_TEST(replay.status == 201u);
  BOOST_TEST(replay.body == R"({"id":7})");
  BOOST_TEST(replay.header("Content-Length").value_or("") == "8");
}

BOOST_AUTO_TEST_CASE(spec_C16_a_204_replays_bodiless_without_content_length) {
  TestUpstream upstream;
  upstream.on("/flags", {{204, {{"X-Trace", "t-204"}}, std::nullopt}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("flags", "/flags", "up")};
  Gateway gateway(config);

  const std::string key = unique_name("c16-204");
  auto connection = gateway.connect();
  const HttpResponse first = connection->request(keyed_post("/flags", key, "{}"));
  BOOST_TEST_REQUIRE(first.status == 204u, gateway.explain(first));
  const HttpResponse replay = connection->request(keyed_post("/flags", key, "{}"));
  BOOST_TEST(replay.status == 204u, describe(replay));
  BOOST_TEST(replayed(replay), describe(replay));
  for (const HttpResponse* res : {&first, &replay}) {
    BOOST_TEST(!res->header("Content-Length").has_value(), describe(*res));
    BOOST_TEST(!res->header("Transfer-Encoding").has_value(), describe(*res));
    BOOST_TEST(res->body.empty());
    BOOST_TEST(res->header("X-Trace").value_or("") == "t-204");
  }
  // Framing was right: the kept-alive connection serves the next request.
  BOOST_TEST_REQUIRE(connection->is_open());
  const HttpResponse next = connection->request(keyed_post("/flags", unique_name("c16"), "{}"));
  BOOST_TEST(next.status == 204u, describe(next));
  BOOST_TEST(upstream.count("/flags") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C16_the_gateway_owns_idempotent_replayed_in_both_directions) {
  TestUpstream upstream;
  // An upstream that claims replays of its own must not confuse clients either.
  upstream.on("/forged", {{201,
                           {{"Content-Type", "application/json"},
                            {"Idempotent-Replayed", "true"},
                            {"Idempotent-Body-Omitted", "true"}},
                           R"({"ok":true})"}});
  upstream.on(
      "/pass",
      {{200, {{"Idempotent-Replayed", "true"}, {"Idempotency-Status", "done"}}, "streamed"}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("plain", "/plain", "up"), route("forged", "/forged", "up"),
                   route("pass", "/pass", "up", "off")};
  Gateway gateway(config);

  const std::string key = unique_name("c16-client");
  const HttpResponse first =
      gateway.send(keyed_post("/plain", key, "{}", {{"Idempotent-Replayed", "true"}}));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  BOOST_TEST(!first.header("Idempotent-Replayed").has_value(), describe(first));
  BOOST_TEST_REQUIRE(upstream.count("/plain") == 1u);
  BOOST_TEST(!upstream.received("/plain").front().value("Idempotent-Replayed").has_value());

  const std::string forged_key = unique_name("c16-upstream");
  const HttpResponse forged = gateway.send(keyed_post("/forged", forged_key, "{}"));
  BOOST_TEST_REQUIRE(forged.status == 201u, gateway.explain(forged));
  BOOST_TEST(!forged.header("Idempotent-Replayed").has_value(), describe(forged));
  BOOST_TEST(!forged.header("Idempotent-Body-Omitted").has_value(), describe(forged));
  const HttpResponse replay = gateway.send(keyed_post("/forged", forged_key, "{}"));
  BOOST_TEST(replay.header_values("Idempotent-Replayed") == std::vector<std::string>{"true"},
             describe(replay));
  BOOST_TEST(!replay.header("Idempotent-Body-Omitted").has_value(), describe(replay));
  BOOST_TEST(replay.body == R"({"ok":true})");
  BOOST_TEST(upstream.count("/forged") == 1u);

  // A pass-through route streams both ways (C38): the owned fields are removed there as well.
  const HttpResponse passed =
      gateway.send(keyed_post("/pass", std::nullopt, "{}", {{"Idempotent-Replayed", "true"}}));
  BOOST_TEST_REQUIRE(passed.status == 200u, gateway.explain(passed));
  BOOST_TEST(passed.body == "streamed");
  BOOST_TEST(!passed.header("Idempotent-Replayed").has_value(), describe(passed));
  BOOST_TEST(!passed.header("Idempotency-Status").has_value(), describe(passed));
  BOOST_TEST_REQUIRE(upstream.count("/pass") == 1u);
  BOOST_TEST(!upstream.received("/pass").front().value("Idempotent-Replayed").has_value());
}

BOOST_AUTO_TEST_CASE(spec_C16_a_replay_is_dated_when_it_is_sent_not_when_it_was_stored) {
  TestUpstream upstream;
  // The upstream dates its answer too: no replay may carry that Date either.
  const std::string upstream_date = "Sun, 06 Nov 1994 08:49:37 GMT";
  upstream.on("/dated",
              {{201, {{"Content-Type", "application/json"}, {"Date", upstream_date}}, "{}"}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("dated", "/dated", "up")};
  Gateway gateway(config);
  RedisClient redis;

  const std::string key = unique_name("c16-date");
  const std::string lock = lock_key(record_id_hex("dated", key));
  const HttpRequest request = keyed_post("/dated", key, "{}");
  const HttpResponse first = gateway.send(request);
  const auto first_received = std::chrono::system_clock::now();
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  const std::string first_date = first.header("Date").value_or("");
  BOOST_TEST_REQUIRE(parse_http_date(first_date).has_value(), describe(first));
  BOOST_TEST_REQUIRE(redis.wait_for_marker(lock), gateway.diagnostics());

  // HTTP-dates count whole seconds: the replays go out two seconds after the first answer came
  // back, so that a Date kept from the first exchange cannot look fresh.
  std::this_thread::sleep_until(first_received + 2s);
  // Replayed from the committed marker in Redis, then (the marker gone) from Postgres.
  for (const bool from_marker : {true, false}) {
    if (!from_marker) BOOST_TEST_REQUIRE(redis.del(lock) == 1);
    const auto sent = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
    const HttpResponse replay = gateway.send(request);
    const auto received = std::chrono::system_clock::now();
    BOOST_TEST_REQUIRE(replayed(replay), describe(replay));
    BOOST_TEST(replay.header_count("Date") == 1u, describe(replay));
    const std::string date = replay.header("Date").value_or("");
    const auto dated = parse_http_date(date);
    BOOST_TEST_REQUIRE(dated.has_value(), "not an HTTP-date: '" << date << "'");
    BOOST_TEST(date != first_date, "the replay has the first answer's Date "
                                       << date << " (from_marker=" << from_marker << ")");
    BOOST_TEST(date != upstream_date, "the replay has the upstream's Date "
                                          << date << " (from_marker=" << from_marker << ")");
    // The Date of the replay lies between its request and its answer.
    BOOST_TEST((*dated >= sent),
               date << " is before the replay was sent (from_marker=" << from_marker << ")");
    BOOST_TEST((*dated <= received),
               date << " is after the replay came back (from_marker=" << from_marker << ")");
  }
  BOOST_TEST(upstream.count("/dated") == 1u);
}

// -------------------------------------------------------------------------------------------
// C18 concurrency: wait

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_duplicate_gets_the_replay_of_the_first) {
  PaymentService service({.delay_ms = 500});
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  config.routes = {payments_route({"concurrency: wait", "wait_timeout: 10s"})};
  Gateway gateway(config);
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c18-wait");
  const std::string body = payment_body(key);
  auto first = std::async(std::launch::async,
                          [&] { return gateway.send(keyed_post("/payments", key, body)); });
  BOOST_TEST_REQUIRE(service.wait_for_counter("payment_posts", posts + 1),
                     "the first request never reached the payment service\n"
                         << gateway.diagnostics());

  const HttpResponse duplicate = gateway.send(keyed_post("/payments", key, body));
  const HttpResponse original = first.get();
  BOOST_TEST_REQUIRE(original.status == 201u, gateway.explain(original));
  BOOST_TEST(!replayed(original));
  BOOST_TEST(duplicate.status == 201u, gateway.explain(duplicate));
  BOOST_TEST(replayed(duplicate), describe(duplicate));
  BOOST_TEST(duplicate.body == original.body);
  BOOST_TEST(duplicate.header("Location").value_or("<none>") ==
             original.header("Location").value_or("<none>"));
  BOOST_TEST(service.counter("payment_posts") == posts + 1);
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_gives_409_when_wait_timeout_runs_out_first) {
  TestUpstream upstream;
  upstream.on("/held", {held()});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {
      route("held", "/held", "up", "required", {"concurrency: wait", "wait_timeout: 200ms"})};
  Gateway gateway(config);

  const std::string key = unique_name("c18-timeout");
  auto first =
      std::async(std::launch::async, [&] { return gateway.send(keyed_post("/held", key, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/held", 1));

  const HttpResponse duplicate = gateway.send(keyed_post("/held", key, "{}"));
  BOOST_TEST(is_problem(duplicate, 409));
  BOOST_TEST(problem_type_ends_with(duplicate, "/request-in-flight"), describe(duplicate));
  BOOST_TEST(duplicate.header("Retry-After").has_value(), describe(duplicate));
  BOOST_TEST(upstream.count("/held") == 1u);

  upstream.release();
  const HttpResponse original = first.get();
  BOOST_TEST(original.status == 201u, describe(original));
  BOOST_TEST(upstream.count("/held") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_waiter_executes_itself_when_the_first_ends_unstored) {
  TestUpstream upstream;
  // The first execution answers 500 (not stored, C21) once released; the next one 201.
  upstream.on("/flaky", {held(500), UpstreamReply{}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {
      route("flaky", "/flaky", "up", "required", {"concurrency: wait", "wait_timeout: 20s"})};
  Gateway gateway(config);

  const std::string key = unique_name("c18-unstored");
  auto first =
      std::async(std::launch::async, [&] { return gateway.send(keyed_post("/flaky", key, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/flaky", 1));
  auto waiter =
      std::async(std::launch::async, [&] { return gateway.send(keyed_post("/flaky", key, "{}")); });
  if (!still_waiting(waiter)) {
    upstream.release();
    const HttpResponse early = waiter.get();
    BOOST_FAIL("the duplicate did not wait:\n" << describe(early) << "\n" << gateway.diagnostics());
  }

  upstream.release();
  const HttpResponse original = first.get();
  BOOST_TEST(original.status == 500u, describe(original));
  const HttpResponse executed = waiter.get();
  BOOST_TEST(executed.status == 201u, gateway.explain(executed));
  BOOST_TEST(!replayed(executed), describe(executed));
  BOOST_TEST(upstream.count("/flaky") == 2u);

  const HttpResponse replay = gateway.send(keyed_post("/flaky", key, "{}"));
  BOOST_TEST(replayed(replay), describe(replay));
  BOOST_TEST(replay.body == executed.body);
  BOOST_TEST(upstream.count("/flaky") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_over_max_waiters_gets_409_at_once) {
  TestUpstream upstream;
  upstream.on("/bounded", {held()});
  GatewayConfig config;
  config.threads = 1;  // the bound is per gateway thread
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("bounded", "/bounded", "up", "required",
                         {"concurrency: wait", "wait_timeout: 20s", "max_waiters: 1"})};
  Gateway gateway(config);

  const std::string key = unique_name("c18-bounded");
  const auto send = [&] { return gateway.send(keyed_post("/bounded", key, "{}")); };
  auto first = std::async(std::launch::async, send);
  BOOST_TEST_REQUIRE(upstream.wait_for("/bounded", 1));

  // Two duplicates: one may wait, the other is over the bound and answered at once, while the
  // first is still held.
  std::vector<std::future<HttpResponse>> duplicates;
  duplicates.push_back(std::async(std::launch::async, send));
  duplicates.push_back(std::async(std::launch::async, send));
  std::optional<std::size_t> answered;
  const bool one_answered = eventually([&] {
    for (std::size_t i = 0; i < duplicates.size(); ++i)
      if (duplicates[i].wait_for(0ms) == std::future_status::ready) answered = i;
    return answered.has_value();
  });
  BOOST_TEST_REQUIRE(one_answered, gateway.diagnostics());
  auto& waiting = duplicates[1 - *answered];
  BOOST_TEST((waiting.wait_for(0ms) == std::future_status::timeout),
             "both duplicates were answered before the first ended");
  const HttpResponse rejected = duplicates[*answered].get();
  BOOST_TEST(is_problem(rejected, 409));
  BOOST_TEST(problem_type_ends_with(rejected, "/request-in-flight"), describe(rejected));
  BOOST_TEST(rejected.header("Retry-After").has_value(), describe(rejected));

  upstream.release();
  const HttpResponse original = first.get();
  BOOST_TEST_REQUIRE(original.status == 201u, describe(original));
  const HttpResponse coalesced = waiting.get();
  BOOST_TEST(replayed(coalesced), describe(coalesced));
  BOOST_TEST(coalesced.body == original.body);
  BOOST_TEST(upstream.count("/bounded") == 1u);
}

// -------------------------------------------------------------------------------------------
// C22 Outcome unknown

BOOST_AUTO_TEST_CASE(spec_C22_reset_after_the_request_was_written_gives_502_and_holds_the_key) {
  // One upstream per route, so that each reset happens on the route's first, fresh upstream
  // connection: a reset on a reused pooled connection before any response byte is retried
  // once on a fresh one (C08), which is not the case under test here.
  TestUpstream hold_upstream;
  TestUpstream release_upstream;
  hold_upstream.on("/hold", {reset_reply(), UpstreamReply{}});
  release_upstream.on("/release", {reset_reply(), UpstreamReply{}});
  GatewayConfig config;
  config.upstreams = {{"hold", {hold_upstream.address()}},
                      {"release", {release_upstream.address()}}};
  const std::string hold_route = unique_route("c22_hold");
  config.routes = {
      route(hold_route, "/hold", "hold", "required", {"lock_ttl: 2s"}),
      route("c22_release", "/release", "release", "required", {"on_unknown_outcome: release"})};
  Gateway gateway(config);
  Database db(require_env("IDEMGATE_PG_DSN"));
  RedisClient redis;

  // hold (default): the upstream may have executed, so the key stays locked until lock_ttl.
  const std::string key = unique_name("c22-hold");
  const HttpResponse failed = gateway.send(keyed_post("/hold", key, "{}"));
  BOOST_TEST(is_problem(failed, 502));
  BOOST_TEST(hold_upstream.count("/hold") == 1u);
  const HttpResponse retry = gateway.send(keyed_post("/hold", key, "{}"));
  BOOST_TEST(is_problem(retry, 409));
  BOOST_TEST(problem_type_ends_with(retry, "/request-in-flight"), describe(retry));
  BOOST_TEST(hold_upstream.count("/hold") == 1u);
  BOOST_TEST(!record_exists(db, hold_route, key), "an unknown outcome was stored");

  // After lock_ttl the key is free and the retry executes.
  BOOST_TEST_REQUIRE(
      eventually([&] { return !redis.exists(lock_key(record_id_hex(hold_route, key))); }),
      "the held lock never expired");
  const HttpResponse later = gateway.send(keyed_post("/hold", key, "{}"));
  BOOST_TEST(later.status == 201u, gateway.explain(later));
  BOOST_TEST(!replayed(later));
  BOOST_TEST(hold_upstream.count("/hold") == 2u);

  // release: the key is free at once.
  const std::string released_key = unique_name("c22-release");
  const HttpResponse reset = gateway.send(keyed_post("/release", released_key, "{}"));
  BOOST_TEST(is_problem(reset, 502));
  const HttpResponse executed = gateway.send(keyed_post("/release", released_key, "{}"));
  BOOST_TEST(executed.status == 201u, gateway.explain(executed));
  BOOST_TEST(!replayed(executed));
  BOOST_TEST(release_upstream.count("/release") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C22_request_timeout_gives_504_and_the_retry_gets_409) {
  TestUpstream upstream;
  upstream.on("/slow", {held()});
  GatewayConfig config;
  config.upstreams = {{"slow", {upstream.address()}, "1s", "300ms"}};
  const std::string slow_route = unique_route("c22_slow");
  config.routes = {route(slow_route, "/slow", "slow")};
  Gateway gateway(config);
  Database db(require_env("IDEMGATE_PG_DSN"));

  const std::string key = unique_name("c22-timeout");
  const HttpResponse timed_out = gateway.send(keyed_post("/slow", key, "{}"));
  BOOST_TEST(is_problem(timed_out, 504));
  const HttpResponse retry = gateway.send(keyed_post("/slow", key, "{}"));
  BOOST_TEST(is_problem(retry, 409));
  BOOST_TEST(problem_type_ends_with(retry, "/request-in-flight"), describe(retry));
  BOOST_TEST(upstream.count("/slow") == 1u);
  BOOST_TEST(!record_exists(db, slow_route, key), "a timed-out request was stored");
  upstream.release();
}

// -------------------------------------------------------------------------------------------
// C29 Responses over max_stored_response

BOOST_AUTO_TEST_CASE(spec_C29_large_response_reaches_the_client_and_replays_without_body) {
  std::string big(64 * 1024, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  TestUpstream upstream;
  upstream.on("/export",
              {{201,
                {{"Content-Type", "text/plain"}, {"Location", "/exports/9"}, {"ETag", "\"e9\""}},
                big}});
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("export", "/export", "up", "required", {"max_stored_response: 1KiB"})};
  Gateway gateway(config);

  const std::string key = unique_name("c29");
  const HttpResponse first = gateway.send(keyed_post("/export", key, "{}"));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));
  BOOST_TEST(first.body == big, "the client got " << first.body.size() << " bytes");
  BOOST_TEST(!replayed(first));
  BOOST_TEST(!first.header("Idempotent-Body-Omitted").has_value());

  const HttpResponse replay = gateway.send(keyed_post("/export", key, "{}"));
  BOOST_TEST(replay.status == 201u, describe(replay));
  BOOST_TEST(replay.body.empty(), "the replay has " << replay.body.size() << " bytes of body");
  BOOST_TEST(replay.header("Content-Length").value_or("0") == "0", describe(replay));
  BOOST_TEST(replayed(replay), describe(replay));
  BOOST_TEST(replay.header("Idempotent-Body-Omitted").value_or("") == "true", describe(replay));
  BOOST_TEST(replay.header("Location").value_or("") == "/exports/9");
  BOOST_TEST(replay.header("ETag").value_or("") == "\"e9\"");
  BOOST_TEST(replay.header("Content-Type").value_or("") == "text/plain");
  BOOST_TEST(upstream.count("/export") == 1u);
}

// -------------------------------------------------------------------------------------------
// C34 A client that goes away

BOOST_AUTO_TEST_CASE(spec_C34_client_that_closes_after_sending_gets_the_replay_on_retry) {
  PaymentService service({.delay_ms = 500});
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  config.routes = {payments_route()};
  Gateway gateway(config);
  Database db(require_env("IDEMGATE_PG_DSN"));
  Database payments(require_env("IDEMGATE_PAYMENTS_DSN"));
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  const std::string key = unique_name("c34");
  const std::string body = payment_body(key);
  {
    auto connection = gateway.connect();
    connection->send_raw(raw_request(
        "POST", "/payments", {"Content-Type: application/json", "Idempotency-Key: " + key}, body));
    connection->close();
  }
  BOOST_TEST_REQUIRE(service.wait_for_counter("payment_posts", posts + 1),
                     "the request never reached the payment service\n"
                         << gateway.diagnostics());
  BOOST_TEST_REQUIRE(eventually([&] { return record_exists(db, "payments", key); }),
                     "the record was never committed\n"
                         << gateway.diagnostics());

  const HttpResponse retry = gateway.send(keyed_post("/payments", key, body));
  BOOST_TEST(retry.status == 201u, gateway.explain(retry));
  BOOST_TEST(replayed(retry), describe(retry));
  BOOST_TEST(
      json::parse(retry.body).at("id").as_int64() ==
      std::stoll(payments.scalar("SELECT id FROM payment WHERE external_payment_id = $1", {key})));
  BOOST_TEST(service.counter("payment_posts") == posts + 1);
  BOOST_TEST(service.counter("payments_inserted") == inserted + 1);
}

// -------------------------------------------------------------------------------------------
// C35 fingerprint_body

BOOST_AUTO_TEST_CASE(spec_C35_json_fingerprint_ignores_key_order_and_space_bytes_does_not) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("json", "/json", "up", "required", {"fingerprint_body: json"}),
                   route("bytes", "/bytes", "up", "required", {"fingerprint_body: bytes"})};
  Gateway gateway(config);

  const std::string compact = R"({"amount":"10.50","currency":"EUR","meta":{"a":1,"b":[1,2]}})";
  const std::string spaced =
      "{ \"meta\" : { \"b\" : [1, 2], \"a\" : 1 },\n  \"currency\": \"EUR\",\t\"amount\": "
      "\"10.50\" }\n";

  const std::string key = unique_name("c35");
  const HttpResponse json_first = gateway.send(keyed_post("/json", key, compact));
  BOOST_TEST_REQUIRE(json_first.status == 201u, gateway.explain(json_first));
  const HttpResponse json_again = gateway.send(keyed_post("/json", key, spaced));
  BOOST_TEST(json_again.status == 201u, describe(json_again));
  BOOST_TEST(replayed(json_again), describe(json_again));
  BOOST_TEST(json_again.body == json_first.body);
  BOOST_TEST(upstream.count("/json") == 1u);

  // A different JSON value is still a mismatch.
  const std::string other = R"({"amount":"10.51","currency":"EUR","meta":{"a":1,"b":[1,2]}})";
  BOOST_TEST(is_problem(gateway.send(keyed_post("/json", key, other)), 422));

  // A body that is not JSON falls back to its bytes.
  const std::string text_key = unique_name("c35-text");
  const HttpResponse text = gateway.send(keyed_post("/json", text_key, "amount=10.50"));
  BOOST_TEST(text.status == 201u, describe(text));
  BOOST_TEST(replayed(gateway.send(keyed_post("/json", text_key, "amount=10.50"))));
  BOOST_TEST(is_problem(gateway.send(keyed_post("/json", text_key, "amount=10.50 ")), 422));
  BOOST_TEST(upstream.count("/json") == 2u);

  // bytes: the same JSON written differently is another request.
  const HttpResponse bytes_first = gateway.send(keyed_post("/bytes", key, compact));
  BOOST_TEST_REQUIRE(bytes_first.status == 201u, gateway.explain(bytes_first));
  BOOST_TEST(is_problem(gateway.send(keyed_post("/bytes", key, spaced)), 422));
  BOOST_TEST(replayed(gateway.send(keyed_post("/bytes", key, compact))));
  BOOST_TEST(upstream.count("/bytes") == 1u);
}

// -------------------------------------------------------------------------------------------
// C27 Framing does not change the fingerprint

BOOST_AUTO_TEST_CASE(spec_C27_content_length_and_chunked_bodies_have_the_same_fingerprint) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route("framing", "/framing", "up", "required", {})};
  Gateway gateway(config);

  // The client sends a body given with `Transfer-Encoding: chunked` as chunks (Beast's
  // serializer); the gateway must hash the decoded bytes, whatever the framing.
  const std::string body = R"({"amount":"10.50","currency":"EUR"})";
  const HeaderList chunked = {{"Transfer-Encoding", "chunked"}};

  const std::string key = unique_name("c27");
  const HttpResponse first = gateway.send(keyed_post("/framing", key, body));
  BOOST_TEST_REQUIRE(first.status == 201u, gateway.explain(first));

  const HttpResponse again = gateway.send(keyed_post("/framing", key, body, chunked));
  BOOST_TEST(again.status == 201u, describe(again));
  BOOST_TEST(replayed(again), describe(again));
  BOOST_TEST(again.body == first.body);
  BOOST_TEST(upstream.count("/framing") == 1u);

  // Different bytes under chunked framing are still a different request.
  BOOST_TEST(is_problem(gateway.send(keyed_post("/framing", key, "other", chunked)), 422));
  BOOST_TEST(upstream.count("/framing") == 1u);
}

// -------------------------------------------------------------------------------------------
// C13 Hostile keys

BOOST_AUTO_TEST_CASE(spec_C13_hostile_keys_get_400_naming_the_problem_and_store_nothing) {
  TestUpstream upstream;
  GatewayConfig config;
  config.limits = "{ max_request_body: 1MiB, max_header_bytes: 8KiB, drain_timeout: 2s }";
  config.upstreams = {{"up", {upstream.address()}}};
  const std::string hostile = unique_route("c13_hostile");
  config.routes = {route(hostile, "/pay", "up")};
  Gateway gateway(config);
  Database db(require_env("IDEMGATE_PG_DSN"));

  struct Case {
    std::string name;
    std::vector<std::string> fields;
    std::string detail;  ///< what the problem's detail names
  };
  const std::vector<Case> cases = {
      {"empty value", {"Idempotency-Key: "}, "must not be empty"},
      {"empty sf-string", {"Idempotency-Key: \"\""}, "must not be empty"},
      {"256 characters", {"Idempotency-Key: " + std::string(256, 'k')}, "limit is 255"},
      {"non-ASCII bytes", {"Idempotency-Key: cl\xC3\xA9"}, "0xC3"},
      {"tab inside", {"Idempotency-Key: a\tb"}, "0x09"},
      {"invalid escape", {"Idempotency-Key: \"a\\qb\""}, "invalid escape"},
      {"two fields", {"Idempotency-Key: a", "Idempotency-Key: b"}, "2 Idempotency-Key fields"},
      {"split quoted string",
       {"Idempotency-Key: \"ab", "Idempotency-Key: cd\""},
       "2 Idempotency-Key fields"},
      {"parameters", {"Idempotency-Key: \"k\";a=1"}, "parameters"},
      {"list", {"Idempotency-Key: a, b"}, "list"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      std::vector<std::string> fields = {"Content-Type: application/json"};
      fields.insert(fields.end(), c.fields.begin(), c.fields.end());
      auto connection = gateway.connect();
      connection->send_raw(raw_request("POST", "/pay", fields, R"({"a":1})"));
      const HttpResponse res = connection->read_response();
      BOOST_TEST(is_problem(res, 400));
      BOOST_TEST(problem_detail(res).find(c.detail) != std::string::npos, describe(res));
    }
  }
  const HttpResponse huge = gateway.send(keyed_post("/pay", std::string(10 * 1024, 'k'), "{}"));
  BOOST_TEST(is_problem(huge, 431));

  BOOST_TEST(upstream.total() == 0u);
  BOOST_TEST(record_count(db, hostile) == 0);

  // The route stores when the key is good: the zero above is not a query that sees nothing.
  const HttpResponse good = gateway.send(keyed_post("/pay", unique_name("c13-good"), "{}"));
  BOOST_TEST(good.status == 201u, gateway.explain(good));
  BOOST_TEST(record_count(db, hostile) == 1);
}
