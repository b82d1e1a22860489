// N instances behind an L4 balancer (SPEC C45): three real `idemgate` processes sharing a private
// Postgres and Redis (scripts/local-stores), behind a real HAProxy in `mode tcp` whose health
// check asks each instance's admin `/readyz`; the payment service is the upstream, its
// `payment_posts` counter the executions and `payments_inserted` the payments made (its UNIQUE
// constraint on the payment id, the second layer of seed R-DIST-IDEM-4).
//
// Each scenario prints one line `scenario=<name> executions=<n> distinct_keys=<k>` and lines
// `figures scenario=<name> …` with the measured times and the answers by kind.
#define BOOST_TEST_MODULE haproxy_scale
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/scale/haproxy.hpp"
#include "tests/support/answers.hpp"
#include "tests/support/keyed_load.hpp"
#include "tests/support/local_stores.hpp"
#include "tests/support/scraping.hpp"

namespace {

using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using idemgate::test::scale::BalancedServer;
using idemgate::test::scale::Haproxy;
using idemgate::test::scale::ServerStat;

constexpr int kInstances = 3;
constexpr auto kClientTimeout = 10s;    ///< safety net on every request
constexpr auto kRetryInterval = 100ms;  ///< between requests of one polling client

// -------------------------------------------------------------------------------------------
// Three instances and the balancer in front of them.

std::string server_name(int instance) {
  return "g" + std::to_string(instance);
}

std::vector<BalancedServer> servers_of(const Gateway& gateway) {
  std::vector<BalancedServer> out;
  for (int i = 0; i < gateway.instances(); ++i)
    out.push_back({server_name(i), gateway.port(i), gateway.admin_port(i)});
  return out;
}

struct Balanced {
  explicit Balanced(const GatewayConfig& config)
      : gateway(config, kInstances), haproxy(servers_of(gateway)) {}

  std::string diagnostics() const { return gateway.diagnostics() + haproxy.diagnostics(); }

  /// Sends `request` through the balancer on a fresh connection.
  Timed send(const HttpRequest& request) const {
    return timed_request(haproxy.port(), request, kClientTimeout);
  }

  /// `idemgate_requests_total{route,outcome}` of one instance.
  double requests(int instance, const std::string& route, const std::string& outcome) const {
    return metric(gateway, instance, "idemgate_requests_total",
                  {{"route", route}, {"outcome", outcome}})
        .value_or(0);
  }

  /// Connections HAProxy sent to each server so far (`stot`), by instance.
  std::vector<std::uint64_t> sessions() const {
    const auto stats = haproxy.stats();
    std::vector<std::uint64_t> out;
    for (int i = 0; i < kInstances; ++i) out.push_back(stats.at(server_name(i)).sessions);
    return out;
  }

  Gateway gateway;
  Haproxy haproxy;
};

std::string payments_route(const std::string& lock_ttl = "30s") {
  return "  - name: pay\n"
         "    match: { path_prefix: /payments, methods: [POST] }\n"
         "    upstream: payments\n"
         "    idempotency: { mode: required, methods: [POST], concurrency: reject, lock_ttl: " +
         lock_ttl + " }\n";
}

GatewayConfig config_for(const PaymentService& payments, const std::string& lock_ttl = "30s") {
  GatewayConfig config;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml = payments_route(lock_ttl);
  return config;
}

HttpRequest payment_post(const std::string& key) {
  return keyed_post("/payments", key, payment_body(key));
}

/// Sends every request of `requests` once through the balancer, a few at a time; the answers by
/// index.
std::vector<Timed> send_each(const Balanced& balanced, const std::vector<HttpRequest>& requests) {
  constexpr std::size_t kWorkers = 8;
  std::vector<Timed> answers(requests.size());
  std::atomic<std::size_t> next{0};
  {
    std::vector<std::jthread> workers;
    for (std::size_t w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&] {
        for (std::size_t i = next++; i < requests.size(); i = next++)
          answers[i] = balanced.send(requests[i]);
      });
    }
  }
  return answers;
}

// -------------------------------------------------------------------------------------------
// Steady keyed load through the balancer: each thread sends a new key at a time.

KeyedLoad::Options load_through(const Balanced& balanced, int threads) {
  KeyedLoad::Options options;
  options.new_request = [] { return payment_post(unique_name("c45-load")); };
  options.send = [&balanced](const HttpRequest& request, int) { return balanced.send(request); };
  options.threads = threads;
  return options;
}

/// Waits until the load got `n` successes to requests sent after `after`; false after
/// kEventDeadline.
bool wait_for_answers(const KeyedLoad& load, std::size_t n, Clock::time_point after) {
  return eventually([&] { return load.successes_after(after) >= n; });
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(PrivateStores);

// -------------------------------------------------------------------------------------------
// C15 and C19 through the balancer

BOOST_AUTO_TEST_CASE(spec_C45_storm_through_balancer_executes_once_and_distinct_keys_reach_all) {
  PaymentService payments({.delay_ms = 300});
  Balanced balanced(config_for(payments));

  // C19: 50 identical requests with one key, at once, spread by the balancer.
  constexpr std::size_t kStorm = 50;
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");
  const auto sessions_before = balanced.sessions();
  const HttpRequest storm = payment_post(unique_name("c45-storm"));
  const auto results = run_concurrently(kStorm, [&](std::size_t) {
    return http_request(kLoopback, balanced.haproxy.port(), storm, kClientTimeout);
  });
  std::vector<const HttpResponse*> executions;
  std::vector<const HttpResponse*> replays;
  std::map<std::string, int> kinds;
  for (const auto& r : results) {
    Timed t;
    t.error = r.error;
    t.response = r.response;
    const std::string kind = kind_of(t);
    ++kinds[kind];
    if (kind == "executed") executions.push_back(&r.response);
    if (kind == "replayed") replays.push_back(&r.response);
    BOOST_TEST((kind == "executed" || kind == "replayed" || kind == "409"),
               "storm answer " << kind << ": " << r.error << "\n"
                               << describe(r.response));
  }
  BOOST_TEST_REQUIRE(executions.size() == 1u, summary(kinds) << "\n" << balanced.diagnostics());
  for (const auto* r : replays) BOOST_TEST(r->body == executions.front()->body);
  BOOST_TEST(payments.counter("payment_posts") == posts + 1);
  BOOST_TEST(payments.counter("payments_inserted") == inserted + 1);
  const auto sessions_storm = balanced.sessions();
  std::uint64_t storm_sessions = 0;
  std::string storm_spread;
  for (int i = 0; i < kInstances; ++i) {
    const auto n = sessions_storm[i] - sessions_before[i];
    storm_sessions += n;
    storm_spread += " storm_sessions_g" + std::to_string(i) + "=" + std::to_string(n);
    BOOST_TEST(n > 0u, "the balancer sent none of the storm to instance " << i);
  }
  BOOST_TEST(storm_sessions == kStorm);
  report("C45_storm_through_balancer", payments.counter("payment_posts") - posts, 1);

  // C15: distinct keys, each executed once, by every instance.
  constexpr std::size_t kKeys = 30;
  std::vector<double> executed_before;
  for (int i = 0; i < kInstances; ++i)
    executed_before.push_back(balanced.requests(i, "pay", "executed"));
  const auto posts_distinct = payments.counter("payment_posts");
  const auto inserted_distinct = payments.counter("payments_inserted");
  std::vector<HttpRequest> requests;
  for (std::size_t i = 0; i < kKeys; ++i) requests.push_back(payment_post(unique_name("c45-key")));
  const auto distinct = run_concurrently(kKeys, [&](std::size_t i) {
    return http_request(kLoopback, balanced.haproxy.port(), requests[i], kClientTimeout);
  });
  for (const auto& r : distinct) {
    BOOST_TEST((r.error.empty() && r.response.status == 201u && !replayed(r.response)),
               r.error << "\n"
                       << describe(r.response));
  }
  BOOST_TEST(payments.counter("payment_posts") == posts_distinct + kKeys);
  BOOST_TEST(payments.counter("payments_inserted") == inserted_distinct + kKeys);
  double executed_sum = 0;
  std::string spread;
  for (int i = 0; i < kInstances; ++i) {
    const double n = balanced.requests(i, "pay", "executed") - executed_before[i];
    executed_sum += n;
    spread += " executed_g" + std::to_string(i) + "=" + std::to_string(static_cast<int>(n));
    BOOST_TEST(n > 0, "instance " << i << " executed none of the distinct keys");
  }
  BOOST_TEST(executed_sum == static_cast<double>(kKeys));
  // Each retry replays its own key's answer, wherever the balancer sends it.
  const auto retries = send_each(balanced, requests);
  for (std::size_t i = 0; i < kKeys; ++i) {
    const Timed& again = retries[i];
    BOOST_TEST((again.answered() && replayed(again.response) &&
                again.response.body == distinct[i].response.body),
               again.error << "\n"
                           << describe(again.response));
  }
  BOOST_TEST(payments.counter("payment_posts") == posts_distinct + kKeys);
  report("C45_distinct_keys_through_balancer", payments.counter("payment_posts") - posts_distinct,
         kKeys);
  std::cout << "figures scenario=C45_storm_through_balancer " << summary(kinds) << storm_spread
            << spread << std::endl;
}

// -------------------------------------------------------------------------------------------
// Drain with SIGTERM

BOOST_AUTO_TEST_CASE(spec_C45_sigterm_drain_under_load_marks_the_server_down_and_loses_no_answer) {
  constexpr int kDrained = 1;
  PaymentService payments({.delay_ms = 200});
  // A request held at this upstream keeps the drained instance in its drain for as long as the
  // test needs to watch the balancer, without a clock.
  TestUpstream holder;
  UpstreamReply held;
  held.hold = true;
  holder.on("/hold", {held});
  GatewayConfig config = config_for(payments);
  config.upstreams.push_back({"holder", {holder.address()}});
  config.routes_yaml +=
      "  - name: hold\n"
      "    match: { path_prefix: /hold }\n"
      "    upstream: holder\n"
      "    idempotency: { mode: required, methods: [POST] }\n";
  config.limits = "{ max_request_body: 1MiB, drain_timeout: 30s }";
  Balanced balanced(config);
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");

  const HttpRequest hold_request = keyed_post("/hold", unique_name("c45-hold"), "{}");
  auto hold_answer = std::async(std::launch::async, [&] {
    return http_request(kLoopback, balanced.gateway.port(kDrained), hold_request, kClientTimeout);
  });
  BOOST_REQUIRE_MESSAGE(holder.wait_for("/hold", 1), balanced.diagnostics());

  KeyedLoad load(load_through(balanced, 4));
  load.start();
  const auto load_start = Clock::now();
  BOOST_REQUIRE_MESSAGE(wait_for_answers(load, 6, load_start), balanced.diagnostics());

  const auto sigterm = Clock::now();
  balanced.gateway.signal(SIGTERM, kDrained);
  // /readyz answers 503 from the start of the drain: the balancer's check fails with that
  // status (L7STS), not with a refused connection, since the process is still draining.
  const auto [down, marked_down] = balanced.haproxy.wait_for_status(server_name(kDrained), "DOWN");
  BOOST_TEST(down.check_status == "L7STS", "check " << down.check_status);
  BOOST_TEST(down.check_code == 503);
  BOOST_TEST((hold_answer.wait_for(0s) == std::future_status::timeout),
             "the held request was answered before the balancer marked the server down");

  // New connections go to the other instances only.
  const auto sessions_down = balanced.sessions();
  const auto after_down = Clock::now();
  BOOST_REQUIRE_MESSAGE(wait_for_answers(load, 12, after_down), balanced.diagnostics());
  load.stop();
  const auto sessions_end = balanced.sessions();
  BOOST_TEST(sessions_end[kDrained] == sessions_down[kDrained],
             "the balancer sent new connections to the drained instance");
  std::uint64_t to_others = 0;
  for (int i = 0; i < kInstances; ++i)
    if (i != kDrained) to_others += sessions_end[i] - sessions_down[i];
  BOOST_TEST(to_others >= load.successes_after(after_down));

  // The drain finishes the held request, then the process exits cleanly.
  holder.release();
  const HttpResponse hold = hold_answer.get();
  BOOST_TEST(hold.status == 201u, describe(hold));
  BOOST_TEST(balanced.gateway.stop(kDrained) == 0, balanced.gateway.stderr_tail(kDrained));

  // Every answered key keeps its answer: its retry through the balancer replays it byte for
  // byte. A request without an answer reached the drained instance as its drain began and was
  // closed unread (still in the listen queue, or on a connection not read yet): its retry is its
  // first execution.
  std::map<std::string, int> kinds;
  std::map<std::string, int> retry_kinds;
  std::uint64_t executions_seen = 0;
  int reported = 0;
  std::vector<HttpRequest> again_requests;
  for (const auto& record : load.records()) again_requests.push_back(record.request);
  const auto retries = send_each(balanced, again_requests);
  for (std::size_t i = 0; i < retries.size(); ++i) {
    const KeyRecord& record = load.records()[i];
    const Timed& answer = record.answers.front();
    const std::string kind = kind_of(answer);
    ++kinds[kind];
    BOOST_TEST((kind == "executed" || kind == "no-answer"),
               "answer under drain: " << kind << "\n"
                                      << describe(answer.response));
    executions_seen += kind == "executed";
    const Timed& again = retries[i];
    const std::string again_kind = kind_of(again);
    ++retry_kinds[again_kind];
    executions_seen += again_kind == "executed";
    const bool kept = answer.answered() ? again_kind == "replayed" &&
                                              again.response.status == answer.response.status &&
                                              again.response.body == answer.response.body
                                        : again_kind == "executed";
    if (!kept && reported++ < 5) {
      BOOST_TEST(kept, "first answer " << kind << ":\n"
                                       << describe(answer.response) << "\nretry " << again_kind
                                       << ": " << again.error << "\n"
                                       << describe(again.response));
    } else if (!kept) {
      BOOST_TEST(kept);
    }
  }
  const Timed hold_again = balanced.send(hold_request);
  BOOST_TEST((replayed(hold_again.response) && hold_again.response.body == hold.body),
             describe(hold_again.response));
  BOOST_TEST(holder.count("/hold") == 1u);

  // One execution per key: the executions the service counted are the executed answers seen,
  // and every key made exactly one payment.
  const auto executions = payments.counter("payment_posts") - posts;
  const auto keys = load.records().size();
  BOOST_TEST(executions == executions_seen);
  BOOST_TEST(executions == keys);
  BOOST_TEST(payments.counter("payments_inserted") - inserted == keys);
  report("C45_sigterm_drain_under_load", executions, keys);
  std::cout << "figures scenario=C45_sigterm_drain_under_load sigterm_to_down_ms="
            << ms(marked_down - sigterm) << " keys=" << keys << " first: " << summary(kinds)
            << " retries: " << summary(retry_kinds)
            << " sessions_after_down_drained=" << sessions_end[kDrained] - sessions_down[kDrained]
            << " sessions_after_down_others=" << to_others << std::endl;
}

// -------------------------------------------------------------------------------------------
// SIGKILL with requests in flight

// SPEC C45: "keys in flight at a SIGKILL get 409 until lock_ttl, then execute once" (and C23: a
// gateway killed mid-request leaves the lock to expire after lock_ttl; then the retry executes).
//
// How the count is made: the payment service counts a POST when it arrives, before its delay,
// and then inserts the payment even though the gateway that sent it died (it answers into a
// closed connection). So a key in flight at the kill was already executed once at the service;
// once its lock expires, the retry is executed once more by the gateway (exactly one of the
// concurrent retries; the others get 409, then the replay of it). At the service that retry
// meets the payment the cut-off execution inserted, and its UNIQUE constraint answers 200 with
// that payment instead of making a second one (C21's second layer). Hence:
//   payment_posts delta     = requests sent + keys in flight at the killed instance,
//   payments_inserted delta = requests sent (one payment per key).
BOOST_AUTO_TEST_CASE(spec_C45_sigkill_in_flight_keys_409_until_lock_ttl_then_execute_once) {
  constexpr int kKilled = 1;
  constexpr std::size_t kRequests = 6;  // round-robin: two in flight at each instance
  constexpr std::size_t kPollersPerKey = 2;
  constexpr auto kLockTtl = 2s;
  PaymentService payments({.delay_ms = 1500});  // in flight well past the kill
  Balanced balanced(config_for(payments, std::to_string(kLockTtl.count()) + "s"));
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");

  std::vector<HttpRequest> requests;
  std::vector<std::future<Timed>> originals;
  for (std::size_t i = 0; i < kRequests; ++i) {
    requests.push_back(payment_post(unique_name("c45-kill")));
    originals.push_back(std::async(std::launch::async,
                                   [&balanced, r = requests.back()] { return balanced.send(r); }));
  }
  // Every request is at the service, sleeping: in flight at its instance.
  BOOST_REQUIRE_MESSAGE(payments.wait_for_counter("payment_posts", posts + kRequests),
                        balanced.diagnostics());
  const auto killed = Clock::now();
  balanced.gateway.signal(SIGKILL, kKilled);

  // Right away, and until each key has a 2xx: several clients per key retry through the
  // balancer, which sends them to the instances alive.
  std::vector<std::vector<Timed>> polls(kRequests);
  std::vector<std::mutex> poll_mutex(kRequests);
  std::vector<std::jthread> pollers;
  for (std::size_t k = 0; k < kRequests; ++k) {
    for (std::size_t p = 0; p < kPollersPerKey; ++p) {
      pollers.emplace_back([&, k] {
        eventually(
            [&] {
              Timed t = balanced.send(requests[k]);
              const bool done = t.answered() && success(t.response);
              std::lock_guard lock(poll_mutex[k]);
              polls[k].push_back(std::move(t));
              return done;
            },
            kRetryInterval);
      });
    }
  }
  const auto [down, marked_down] = balanced.haproxy.wait_for_status(server_name(kKilled), "DOWN");
  for (auto& t : pollers) t.join();

  // Until the balancer marks the killed server DOWN it may still pick it: while the kernel tears
  // the killed process down, its listening socket completes handshakes and then resets them, so
  // such a retry gets no answer at all (never a wrong one). A retry after that must answer.
  const auto allowed_before_execution = [&](const Timed& a) {
    return kind_of(a) == "409" || (!a.answered() && a.start < marked_down);
  };
  std::size_t orphans = 0;
  std::map<std::string, int> original_kinds;
  std::map<std::string, int> poll_kinds;
  std::string execution_figures;
  for (std::size_t k = 0; k < kRequests; ++k) {
    const Timed original = originals[k].get();
    const std::string original_kind = kind_of(original);
    ++original_kinds[original_kind];
    auto& answers = polls[k];
    std::sort(answers.begin(), answers.end(),
              [](const Timed& a, const Timed& b) { return a.start < b.start; });
    std::vector<const Timed*> executions;
    std::vector<const Timed*> replays;
    std::size_t conflicts = 0;
    for (const auto& a : answers) {
      const std::string kind = kind_of(a);
      ++poll_kinds[kind];
      if (kind == "executed") executions.push_back(&a);
      if (kind == "replayed") replays.push_back(&a);
      conflicts += kind == "409";
      BOOST_TEST((kind == "executed" || kind == "replayed" || allowed_before_execution(a)),
                 "retry answer " << kind << " " << ms(a.start - killed)
                                 << " ms after the kill: " << a.error << "\n"
                                 << describe(a.response));
    }
    BOOST_TEST_CONTEXT("key " << k << " (first answer " << original_kind << ")") {
      // The lock outlived the kill: retries met it, held by whichever instance (alive or
      // killed) had the request.
      BOOST_TEST(conflicts > 0u, "no retry got 409");
      if (original.answered()) {
        // In flight at an instance that lived: answered, and its retries replay that answer.
        BOOST_TEST(original_kind == "executed", describe(original.response));
        BOOST_TEST(executions.empty(), "a key answered by a live instance executed again");
        for (const auto* r : replays) BOOST_TEST(r->response.body == original.response.body);
        continue;
      }
      // In flight at the killed instance: no answer; 409 until its lock expired, then exactly
      // one retry executed and the others got 409 or its replay.
      ++orphans;
      BOOST_TEST_REQUIRE(executions.size() == 1u, balanced.diagnostics());
      const Timed& execution = *executions.front();
      for (const auto& a : answers) {
        if (a.start < execution.start)
          BOOST_TEST(allowed_before_execution(a), "before the execution: " << kind_of(a));
      }
      for (const auto* r : replays) BOOST_TEST(r->response.body == execution.response.body);
      // The service's UNIQUE constraint found the payment of the cut-off execution.
      BOOST_TEST(execution.response.status == 200u, describe(execution.response));
      execution_figures += " key" + std::to_string(k) + "_kill_to_execution_sent_ms=" +
                           std::to_string(ms(execution.start - killed));
      const Timed later = balanced.send(requests[k]);
      BOOST_TEST((replayed(later.response) && later.response.body == execution.response.body),
                 describe(later.response));
    }
  }
  BOOST_TEST(orphans > 0u,
             "no request was in flight at the killed instance: " << summary(original_kinds));

  const auto executions = payments.counter("payment_posts") - posts;
  BOOST_TEST(executions == kRequests + orphans);
  BOOST_TEST(payments.counter("payments_inserted") - inserted == kRequests);
  report("C45_sigkill_in_flight", executions, kRequests);
  std::cout << "figures scenario=C45_sigkill_in_flight lock_ttl_ms=" << ms(kLockTtl)
            << " kill_to_down_ms=" << ms(marked_down - killed)
            << " down_check=" << down.check_status << " in_flight_at_killed=" << orphans
            << " first: " << summary(original_kinds) << " retries: " << summary(poll_kinds)
            << execution_figures << std::endl;
}
