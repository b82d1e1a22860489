// Operating the gateway (SPEC §1 signals, §5): admin endpoints, metrics after a scripted run,
// SIGHUP reload, SIGTERM drain and the `keys` command, on the real binary against the stores in
// IDEMGATE_PG_DSN / IDEMGATE_REDIS_ADDR.
#define BOOST_TEST_MODULE ops_e2e
#include <signal.h>

#include <boost/test/unit_test.hpp>
#include <fstream>
#include <latch>
#include <thread>

#include "gateway/core/replay_marker.hpp"
#include "tests/ops/ops_support.hpp"
#include "tests/support/polling.hpp"

namespace idemgate::test::ops {
namespace {

using namespace std::chrono_literals;
using e2e::GatewayConfig;
using e2e::is_problem;
using e2e::keyed_post;
using e2e::RouteConfig;
using e2e::TestUpstream;
using e2e::unique_name;
using e2e::UpstreamConfig;
using e2e::UpstreamReply;

RouteConfig route(const std::string& name, const std::string& prefix, const std::string& mode,
                  std::vector<std::string> scope = {}) {
  RouteConfig r;
  r.name = name;
  r.path_prefix = prefix;
  r.upstream = "up";
  r.mode = mode;
  r.key_scope_headers = std::move(scope);
  return r;
}

// A reply held until TestUpstream::release().
UpstreamReply held() {
  UpstreamReply reply;
  reply.hold = true;
  return reply;
}

// The connection reset after the request was read: an unknown outcome (C22).
UpstreamReply reset() {
  UpstreamReply reply;
  reply.reset = true;
  return reply;
}

GatewayConfig config_for(const TestUpstream& upstream, std::vector<RouteConfig> routes) {
  GatewayConfig config;
  config.upstreams = {UpstreamConfig{"up", {upstream.address()}}};
  config.routes = std::move(routes);
  config.limits = "{ max_request_body: 1MiB, drain_timeout: 30s }";
  return config;
}

double metric(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  const auto value = metric_value(text, name, labels);
  BOOST_TEST_INFO("metric " << name << " in:\n" << text);
  BOOST_TEST_REQUIRE(value.has_value());
  return *value;
}

// `idemgate keys …` as a child process, on the gateway's configuration.
e2e::CliResult run_keys(const OpsGateway& gateway, std::vector<std::string> args) {
  return e2e::run_keys(gateway.config_path(), gateway.dir(), std::move(args));
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C30_healthz_and_readyz_answer_200_while_the_stores_answer) {
  TestUpstream upstream;
  OpsGateway gateway(config_for(upstream, {route("all", "/", "off")}).render());

  const auto health = gateway.admin_get("/healthz");
  BOOST_TEST(health.status == 200u, e2e::describe(health));
  const auto ready = gateway.admin_get("/readyz");
  BOOST_TEST(ready.status == 200u, e2e::describe(ready));
  BOOST_TEST(ready.body.find("\"ready\"") != std::string::npos, ready.body);
  BOOST_TEST(gateway.admin_get("/nothing").status == 404u);

  // `close` in a second Connection field line ends the connection after the answer.
  HttpConnection probe(e2e::kLoopback, gateway.admin_port(), 10s);
  probe.send_raw(
      "GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: x-a\r\n"
      "Connection: close\r\n\r\n");
  const auto closing = probe.read_response();
  BOOST_TEST(closing.status == 200u, e2e::describe(closing));
  BOOST_TEST(!closing.keep_alive, e2e::describe(closing));
}

BOOST_AUTO_TEST_CASE(spec_C30_healthz_answers_while_a_scraper_pool_holds_every_admin_connection) {
  TestUpstream upstream;
  OpsGateway gateway(config_for(upstream, {route("all", "/", "off")}).render());
  // The admin listener's 16 connections (conf/REFERENCE.md), each kept alive after an answer or
  // open without a request: the oldest idle one makes room for a probe. Before, the probe
  // waited for one of them to time out (10 s), past the probe's own timeout.
  std::vector<std::unique_ptr<HttpConnection>> pool;
  for (int i = 0; i < 16; ++i) {
    pool.push_back(std::make_unique<HttpConnection>(e2e::kLoopback, gateway.admin_port(), 10s));
    if (i % 2 == 0) {
      const auto res = pool.back()->request({"GET", "/metrics", {}, ""});
      BOOST_TEST_REQUIRE(res.status == 200u, e2e::describe(res));
      BOOST_TEST_REQUIRE(res.keep_alive);
    }
  }
  for (int probe = 0; probe < 3; ++probe) {
    HttpConnection connection(e2e::kLoopback, gateway.admin_port(), 5s);
    const auto health = connection.request({"GET", "/healthz", {}, ""});
    BOOST_TEST(health.status == 200u, e2e::describe(health));
  }
}

BOOST_AUTO_TEST_CASE(spec_C31_metrics_count_the_outcomes_of_a_scripted_run) {
  TestUpstream upstream;
  OpsGateway gateway(
      config_for(upstream, {route("pay", "/pay", "required"), route("open", "/", "off")}).render());
  const std::string key1 = unique_name("metrics");
  const std::string key2 = unique_name("metrics");
  const std::string key3 = unique_name("metrics");

  for (const auto& key : {key1, key2, key3}) {
    const auto res = gateway.send(keyed_post("/pay/charge", key, R"({"amount":1})"));
    BOOST_TEST(res.status == 201u, e2e::describe(res));
  }
  for (int i = 0; i < 2; ++i) {
    const auto res = gateway.send(keyed_post("/pay/charge", key1, R"({"amount":1})"));
    BOOST_TEST(res.header("Idempotent-Replayed").value_or("") == "true", e2e::describe(res));
  }
  BOOST_TEST(is_problem(gateway.send(keyed_post("/pay/charge", key1, R"({"amount":2})")), 422));
  BOOST_TEST(is_problem(gateway.send(keyed_post("/pay/charge", std::nullopt, "{}")), 400));
  BOOST_TEST(gateway.send({"GET", "/status", {}, ""}).status == 201u);

  // A request held at the upstream holds its lock, and its connection is open.
  upstream.on("/pay/slow", {held()});
  const std::string slow_key = unique_name("metrics");
  HttpResponse slow;
  std::thread client(
      [&] { slow = gateway.send(keyed_post("/pay/slow", slow_key, R"({"amount":3})")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/pay/slow", 1));
  const std::string during = gateway.admin_get("/metrics").body;
  upstream.release();
  client.join();
  BOOST_TEST(slow.status == 201u, e2e::describe(slow));
  BOOST_TEST(metric(during, "idemgate_in_flight_locks") == 1);
  BOOST_TEST(metric(during, "idemgate_client_connections") >= 1);

  const auto res = gateway.admin_get("/metrics");
  BOOST_TEST(res.status == 200u);
  BOOST_TEST(res.header("Content-Type").value_or("").find("text/plain") == 0u);
  const std::string& text = res.body;
  using Labels = std::map<std::string, std::string>;
  const std::string requests = "idemgate_requests_total";
  BOOST_TEST(metric(text, requests, Labels{{"route", "pay"}, {"outcome", "executed"}}) == 4);
  BOOST_TEST(metric(text, requests, Labels{{"route", "pay"}, {"outcome", "replayed"}}) == 2);
  BOOST_TEST(metric(text, requests, Labels{{"route", "pay"}, {"outcome", "mismatch"}}) == 1);
  BOOST_TEST(metric(text, requests, Labels{{"route", "pay"}, {"outcome", "missing_key"}}) == 1);
  BOOST_TEST(metric(text, requests, Labels{{"route", "open"}, {"outcome", "passthrough"}}) == 1);
  BOOST_TEST(!metric_value(text, requests, Labels{{"outcome", "in_flight"}}).has_value());

  // Histograms: one upstream exchange per execution, one record insert per execution.
  BOOST_TEST(metric(text, "idemgate_upstream_duration_seconds_count", Labels{{"route", "pay"}}) ==
             4);
  BOOST_TEST(metric(text, "idemgate_upstream_duration_seconds_count", Labels{{"route", "open"}}) ==
             1);
  BOOST_TEST(metric(text, "idemgate_store_duration_seconds_count",
                    Labels{{"store", "postgres"}, {"op", "insert"}}) == 4);
  BOOST_TEST(metric(text, "idemgate_store_duration_seconds_count",
                    Labels{{"store", "postgres"}, {"op", "find"}}) >= 4);
  // Every keyed request asks Redis first (C23): 4 executions, 2 replays, 1 mismatch.
  BOOST_TEST(metric(text, "idemgate_store_duration_seconds_count",
                    Labels{{"store", "redis"}, {"op", "try_acquire"}}) == 7);
  BOOST_TEST(metric(text, "idemgate_store_duration_seconds_bucket",
                    Labels{{"store", "redis"}, {"op", "try_acquire"}, {"le", "+Inf"}}) == 7);

  BOOST_TEST(metric(text, "idemgate_lock_contention_total") == 0);
  BOOST_TEST(metric(text, "idemgate_duplicate_executions_total") == 0);
  BOOST_TEST(metric(text, "idemgate_record_commit_failures_total") == 0);
  BOOST_TEST(metric(text, "idemgate_cleanup_deleted_total") == 0);
  // The slow request's lock becomes its committed marker after the answer went out (detached,
  // C23), so the gauge reaches 0 a moment later.
  BOOST_TEST(eventually(
      [&] { return metric(gateway.admin_get("/metrics").body, "idemgate_in_flight_locks") == 0; }));
  BOOST_TEST(upstream.count("/pay/charge") == 3u);
}

BOOST_AUTO_TEST_CASE(spec_C31_lock_contention_is_counted_when_a_duplicate_arrives_in_flight) {
  TestUpstream upstream;
  upstream.on("/pay/slow", {held()});
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  const std::string key = unique_name("contention");
  HttpResponse first;
  std::thread client([&] { first = gateway.send(keyed_post("/pay/slow", key, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/pay/slow", 1));
  BOOST_TEST(is_problem(gateway.send(keyed_post("/pay/slow", key, "{}")), 409));
  upstream.release();
  client.join();
  BOOST_TEST(first.status == 201u, e2e::describe(first));
  const std::string text = gateway.admin_get("/metrics").body;
  BOOST_TEST(metric(text, "idemgate_lock_contention_total") == 1);
  BOOST_TEST(
      metric(text, "idemgate_requests_total", {{"route", "pay"}, {"outcome", "in_flight"}}) == 1);
}

BOOST_AUTO_TEST_CASE(sighup_applies_a_valid_file_to_new_requests_while_in_flight_ones_finish) {
  TestUpstream upstream;
  upstream.on("/r/slow", {held()});
  OpsGateway gateway(config_for(upstream, {route("r", "/r", "off")}).render());

  // In flight under the first configuration: forwarded without a key.
  HttpResponse in_flight;
  std::thread client([&] { in_flight = gateway.send(keyed_post("/r/slow", std::nullopt, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/r/slow", 1));

  gateway.write_config(config_for(upstream, {route("r", "/r", "required")}).render());
  gateway.signal(SIGHUP);
  BOOST_TEST_REQUIRE(gateway.wait_for_log("configuration reloaded"));

  // New requests run on the new configuration: a key is now required (C10).
  BOOST_TEST(is_problem(gateway.send(keyed_post("/r/new", std::nullopt, "{}")), 400));
  BOOST_TEST(upstream.count("/r/new") == 0u);

  upstream.release();
  client.join();
  BOOST_TEST(in_flight.status == 201u, e2e::describe(in_flight));
}

BOOST_AUTO_TEST_CASE(sighup_with_an_invalid_file_is_logged_and_the_running_config_kept) {
  TestUpstream upstream;
  OpsGateway gateway(config_for(upstream, {route("r", "/r", "off")}).render());
  gateway.write_config("listen: { address: 127.0.0.1, port: 0 }\nroutes: [\n");
  gateway.signal(SIGHUP);
  BOOST_TEST_REQUIRE(gateway.wait_for_log("reload rejected; keeping the running configuration"));
  BOOST_TEST(gateway.running());
  const auto res = gateway.send(keyed_post("/r/still", std::nullopt, "{}"));
  BOOST_TEST(res.status == 201u, e2e::describe(res));
  BOOST_TEST(upstream.count("/r/still") == 1u);
  BOOST_TEST(gateway.log_count("configuration reloaded") == 0u);
}

BOOST_AUTO_TEST_CASE(sigterm_drains_a_request_in_flight_stores_its_record_marks_its_key_exit_0) {
  TestUpstream upstream;
  upstream.on("/pay/drain", {held()});
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  const std::string key = unique_name("drain");

  HttpResponse in_flight;
  std::thread client([&] { in_flight = gateway.send(keyed_post("/pay/drain", key, "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/pay/drain", 1));
  gateway.signal(SIGTERM);
  BOOST_TEST_REQUIRE(gateway.wait_for_log("stopping"));
  upstream.release();
  client.join();

  BOOST_TEST(in_flight.status == 201u, e2e::describe(in_flight));
  BOOST_TEST(in_flight.header("Connection").value_or("") == "close");
  const auto status = gateway.wait_exit();
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(*status == 0);

  const std::string id = e2e::record_id_hex("pay", key);
  e2e::Database db(require_env("IDEMGATE_PG_DSN"));
  BOOST_TEST(db.scalar("SELECT status FROM idempotency_record WHERE id = decode($1, 'hex')",
                       {id}) == "201");
  // The lock became the committed marker before the process exited (C23).
  e2e::RedisClient redis;
  BOOST_TEST(idemgate::core::is_replay_marker(redis.get(e2e::lock_key(id)).value_or("")));
}

// Requests written on idle connections as the drain begins: each one is either served or
// closed unread and never executed. A request the gateway
// runs but cannot answer would leave its client without the answer it paid for (C45).
BOOST_AUTO_TEST_CASE(spec_C45_a_request_arriving_as_the_drain_begins_is_answered_or_not_run) {
  constexpr int kConnections = 200;
  TestUpstream upstream;
  upstream.on("/pay/hold", {held()});
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  // A held request keeps the process draining while the answers are read.
  HttpResponse hold_answer;
  std::thread holder(
      [&] { hold_answer = gateway.send(keyed_post("/pay/hold", unique_name("hold"), "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/pay/hold", 1));

  // Fresh connections, each writing its request as soon as it is open, go out in a burst from
  // several threads with the signal in the middle of it: some are accepted just before the
  // drain, their request already waiting to be read.
  constexpr int kWriters = 8;
  std::vector<std::unique_ptr<HttpConnection>> connections(kConnections);
  std::vector<char> written(kConnections, 0);
  std::latch start(kWriters + 1);
  {
    std::vector<std::jthread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        start.arrive_and_wait();
        for (int i = w; i < kConnections; i += kWriters) {
          try {
            connections[i] = std::make_unique<HttpConnection>(kLoopback, gateway.port(), 10s);
            connections[i]->send(
                keyed_post("/pay/race/" + std::to_string(i), unique_name("race"), "{}"));
            written[i] = 1;
          } catch (const boost::system::system_error&) {
            // refused or closed by the drain before the request went out
          }
        }
      });
    }
    start.arrive_and_wait();
    gateway.signal(SIGTERM);
  }
  int answered = 0;
  int unanswered = 0;
  for (int i = 0; i < kConnections; ++i) {
    const std::string path = "/pay/race/" + std::to_string(i);
    std::optional<HttpResponse> answer;
    if (written[i]) {
      try {
        answer = connections[i]->read_response();
      } catch (const boost::system::system_error&) {
        // closed unread
      }
    }
    if (answer) {
      ++answered;
      BOOST_TEST(answer->status == 201u, path << ": " << e2e::describe(*answer));
      BOOST_TEST(upstream.count(path) == 1u, path);
    } else {
      ++unanswered;
      BOOST_TEST(upstream.count(path) == 0u, path << " ran without an answer");
    }
  }
  upstream.release();
  holder.join();
  BOOST_TEST(hold_answer.status == 201u, e2e::describe(hold_answer));
  const auto status = gateway.wait_exit();
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(*status == 0);
  BOOST_TEST_MESSAGE("answered " << answered << ", closed unread " << unanswered);
}

BOOST_AUTO_TEST_CASE(spec_C45_readyz_turns_503_when_a_drain_begins_and_stays_so_until_exit) {
  TestUpstream upstream;
  upstream.on("/pay/drain", {held()});
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  BOOST_TEST_REQUIRE(gateway.admin_get("/readyz").status == 200u);

  HttpResponse in_flight;
  std::thread client(
      [&] { in_flight = gateway.send(keyed_post("/pay/drain", unique_name("c45"), "{}")); });
  BOOST_TEST_REQUIRE(upstream.wait_for("/pay/drain", 1));
  gateway.signal(SIGTERM);
  BOOST_TEST_REQUIRE(gateway.wait_for_log("stopping"));
  // The request in flight keeps the process draining: readiness says so, health does not.
  const auto draining = gateway.admin_get("/readyz");
  BOOST_TEST(draining.status == 503u, e2e::describe(draining));
  BOOST_TEST(draining.body.find(R"("status":"draining")") != std::string::npos, draining.body);
  BOOST_TEST(gateway.admin_get("/healthz").status == 200u);
  BOOST_TEST(gateway.admin_get("/readyz").status == 503u);  // stays 503 while draining
  upstream.release();
  client.join();
  BOOST_TEST(in_flight.status == 201u, e2e::describe(in_flight));
  const auto status = gateway.wait_exit();
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(*status == 0);
}

BOOST_AUTO_TEST_CASE(keys_show_prints_the_record_and_purge_deletes_it_so_a_retry_executes) {
  TestUpstream upstream;
  OpsGateway gateway(
      config_for(upstream, {route("pay", "/pay", "required", {"Authorization"})}).render());
  const std::string key = unique_name("cli");
  const auto first = gateway.send(
      keyed_post("/pay/charge", key, R"({"amount":5})", {{"Authorization", "Bearer alice"}}));
  BOOST_TEST_REQUIRE(first.status == 201u, e2e::describe(first));
  const std::string id = e2e::record_id_hex("pay", key, {{"Authorization", {"Bearer alice"}}});
  e2e::RedisClient redis;
  BOOST_TEST_REQUIRE(redis.wait_for_marker(e2e::lock_key(id)));  // the lock became the marker

  const auto shown = run_keys(gateway, {"show", "--route", "pay", "--scope-header",
                                        "Authorization: Bearer alice", "\"" + key + "\""});
  BOOST_TEST(shown.status == 0, shown.err);
  BOOST_TEST(shown.out.find("id " + id + "\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("status 201\n") != std::string::npos, shown.out);
  BOOST_TEST(
      shown.out.find("body_size " + std::to_string(first.body.size()) + "\n") != std::string::npos,
      shown.out);
  BOOST_TEST(shown.out.find("body_omitted false\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("lock free\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("replay_marker present\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("fingerprint ") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("expires ") != std::string::npos, shown.out);

  // Another client's scope holds no record under the same key (C20).
  const auto other = run_keys(
      gateway, {"show", "--route", "pay", "--scope-header", "Authorization: Bearer bob", key});
  BOOST_TEST(other.status == 1);
  BOOST_TEST(other.out == "not found\n");

  const auto purged = run_keys(
      gateway, {"purge", "--route", "pay", "--scope-header", "Authorization: Bearer alice", key});
  BOOST_TEST(purged.status == 0, purged.err);
  BOOST_TEST(purged.out.find("deleted record " + id) != std::string::npos, purged.out);
  BOOST_TEST(purged.out.find("deleted replay marker ") != std::string::npos, purged.out);
  BOOST_TEST(!redis.exists(e2e::lock_key(id)));
  const auto gone = run_keys(
      gateway, {"show", "--route", "pay", "--scope-header", "Authorization: Bearer alice", key});
  BOOST_TEST(gone.status == 1);

  const auto again = gateway.send(
      keyed_post("/pay/charge", key, R"({"amount":5})", {{"Authorization", "Bearer alice"}}));
  BOOST_TEST(again.status == 201u, e2e::describe(again));
  BOOST_TEST(!again.header("Idempotent-Replayed").has_value());
  BOOST_TEST(upstream.count("/pay/charge") == 2u);
}

BOOST_AUTO_TEST_CASE(keys_purge_frees_a_lock_left_by_an_unknown_outcome) {
  TestUpstream upstream;
  upstream.on("/pay/reset", {reset(), UpstreamReply{}});
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  const std::string key = unique_name("cli-lock");
  // C22 hold: the lock stays until lock_ttl (30 s), so a retry gets 409 ...
  BOOST_TEST(is_problem(gateway.send(keyed_post("/pay/reset", key, "{}")), 502));
  BOOST_TEST(is_problem(gateway.send(keyed_post("/pay/reset", key, "{}")), 409));
  // ... until an operator purges the key.
  const auto purged = run_keys(gateway, {"purge", "--route", "pay", key});
  BOOST_TEST(purged.status == 0, purged.err);
  BOOST_TEST(purged.out.find("deleted lock ") != std::string::npos, purged.out);
  const auto retry = gateway.send(keyed_post("/pay/reset", key, "{}"));
  BOOST_TEST(retry.status == 201u, e2e::describe(retry));
}

BOOST_AUTO_TEST_CASE(keys_rejects_an_unknown_route_with_status_2) {
  TestUpstream upstream;
  OpsGateway gateway(config_for(upstream, {route("pay", "/pay", "required")}).render());
  const auto res = run_keys(gateway, {"show", "--route", "nope", "k"});
  BOOST_TEST(res.status == 2);
  BOOST_TEST(res.err.find("no route named 'nope'") != std::string::npos, res.err);
}

}  // namespace idemgate::test::ops
