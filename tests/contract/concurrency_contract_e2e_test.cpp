// Many requests at once and over time, end to end: identical requests spread over three gateway
// processes that share Postgres and Redis (SPEC C19), and keyed POSTs spaced around the
// upstream's keep-alive timeout (C08).
#define BOOST_TEST_MODULE concurrency_contract_e2e
#include <boost/test/unit_test.hpp>
#include <thread>

#include "tests/contract/contract_support.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;
using namespace std::chrono_literals;

/// Tally of the answers to one key's concurrent requests.
struct Tally {
  std::vector<const HttpResponse*> executed;  ///< 201 without Idempotent-Replayed
  std::vector<const HttpResponse*> replays;
  std::size_t in_flight = 0;  ///< 409 request-in-flight problems
  std::vector<std::string> unexpected;
};

Tally tally(const std::vector<ConcurrentResult>& results) {
  Tally t;
  for (const auto& r : results) {
    if (!r.error.empty()) {
      t.unexpected.push_back(r.error);
    } else if (r.response.status == 201u && !replayed(r.response)) {
      t.executed.push_back(&r.response);
    } else if (r.response.status == 201u) {
      t.replays.push_back(&r.response);
    } else if (is_problem(r.response, 409) &&
               problem_type_ends_with(r.response, "/request-in-flight")) {
      ++t.in_flight;
    } else {
      t.unexpected.push_back(describe(r.response));
    }
  }
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C19_hundred_identical_posts_over_three_gateways_execute_once) {
  PaymentService service({.delay_ms = 300});
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  // One payment service, two routes told apart by Host: the same three processes serve both
  // modes. max_waiters is raised above the 100 clients: how the OS spreads connections over a
  // process's threads is not this test's subject (the bound has its own test).
  config.routes_yaml =
      "  - name: c19_reject\n"
      "    match: { host: reject.test, path_prefix: /payments, methods: [POST] }\n"
      "    upstream: payments\n"
      "    idempotency: { mode: required, methods: [POST], concurrency: reject }\n"
      "  - name: c19_wait\n"
      "    match: { host: wait.test, path_prefix: /payments, methods: [POST] }\n"
      "    upstream: payments\n"
      "    idempotency: { mode: required, methods: [POST], concurrency: wait,\n"
      "                   wait_timeout: 20s, max_waiters: 200 }\n";
  Gateway gateway(config, 3);
  Database payments(require_env("IDEMGATE_PAYMENTS_DSN"));
  constexpr std::size_t kClients = 100;

  for (const std::string mode : {"reject", "wait"}) {
    BOOST_TEST_CONTEXT("concurrency: " << mode) {
      const auto posts = service.counter("payment_posts");
      const auto inserted = service.counter("payments_inserted");
      const std::string key = unique_name("c19-" + mode);
      const std::string body = payment_body(key, "42.42");
      const auto results = run_concurrently(kClients, [&](std::size_t i) {
        return gateway.send(keyed_post("/payments", key, body, {{"Host", mode + ".test"}}),
                            static_cast<int>(i % 3));
      });
      const Tally t = tally(results);
      BOOST_TEST_MESSAGE(mode << ": executed " << t.executed.size() << ", replayed "
                              << t.replays.size() << ", in flight " << t.in_flight);
      for (const auto& u : t.unexpected) BOOST_TEST(false, "unexpected answer: " << u);
      BOOST_TEST_REQUIRE(t.executed.size() == 1u, gateway.diagnostics());
      for (const auto* r : t.replays) BOOST_TEST(r->body == t.executed.front()->body);
      if (mode == "wait") BOOST_TEST(t.replays.size() == kClients - 1);
      BOOST_TEST(t.executed.size() + t.replays.size() + t.in_flight == kClients);

      BOOST_TEST(service.counter("payment_posts") == posts + 1);
      BOOST_TEST(service.counter("payments_inserted") == inserted + 1);
      BOOST_TEST(payments.scalar("SELECT count(*) FROM payment WHERE external_payment_id = $1",
                                 {key}) == "1");
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C08_posts_spaced_around_the_upstream_keep_alive_timeout_run_once) {
  PaymentService service({.keep_alive_timeout_s = 1});
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  RouteConfig r = route("payments", "/payments", "payments");
  r.match_methods = {"POST"};
  r.methods = {"POST"};
  config.routes = {r};
  Gateway gateway(config);
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  // 300 POSTs in six bursts of 50 (five clients, ten each over kept-alive connections), with
  // pauses that straddle the service's 1 s keep-alive timeout: the gateway's pooled connections
  // go idle for just under, at, and just over the time the service closes them. The pauses are
  // the stimulus of this test, not a wait for an event.
  constexpr std::size_t kBursts = 6;
  constexpr std::size_t kClients = 5;
  constexpr std::size_t kPerClient = 10;
  const std::chrono::milliseconds pauses[] = {900ms, 950ms, 1000ms, 1050ms, 1100ms};
  std::vector<std::string> failures;
  std::size_t created = 0;
  for (std::size_t burst = 0; burst < kBursts; ++burst) {
    if (burst > 0) std::this_thread::sleep_for(pauses[(burst - 1) % std::size(pauses)]);
    const auto results = run_concurrently(kClients, [&](std::size_t client) {
      auto connection = gateway.connect();
      HttpResponse last;
      for (std::size_t i = 0; i < kPerClient; ++i) {
        const std::string key =
            unique_name("c08-" + std::to_string(burst) + "-" + std::to_string(client));
        last = connection->request(keyed_post("/payments", key, payment_body(key)));
        if (last.status != 201u || replayed(last)) return last;
      }
      return last;
    });
    for (const auto& res : results) {
      if (!res.error.empty()) {
        failures.push_back(res.error);
      } else if (res.response.status != 201u || replayed(res.response)) {
        failures.push_back(describe(res.response));
      } else {
        created += kPerClient;
      }
    }
  }
  BOOST_TEST(failures.empty(), failures.size() << " clients failed; the first:\n"
                                               << (failures.empty() ? "" : failures.front()) << "\n"
                                               << gateway.diagnostics());
  BOOST_TEST(created == kBursts * kClients * kPerClient);
  BOOST_TEST(service.counter("payments_inserted") == inserted + kBursts * kClients * kPerClient);
  BOOST_TEST(service.counter("payment_posts") == posts + kBursts * kClients * kPerClient);
}
