// Redis Sentinel (SPEC C41, C46): real `idemgate` and `payment-service` processes against a
// Sentinel deployment (primary, replica, three sentinels) that this binary starts on loopback
// and fails over by SIGKILLing the primary, plus a private Postgres (scripts/local-stores).
//
// Each scenario prints one line `scenario=<name> executions=<n> distinct_keys=<k>` (executions:
// the payment services' `payment_posts` delta, distinct_keys: keys answered 2xx) and lines
// `figures scenario=<name> …` with the measured times and the answers by kind.
#define BOOST_TEST_MODULE redis_sentinel_scale
#include <signal.h>

#include <atomic>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <csignal>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gateway/core/replay_marker.hpp"
#include "tests/e2e/gateway_fixture.hpp"
#include "tests/fault/local_stores.hpp"
#include "tests/ops/metric_text.hpp"
#include "tests/scale/redis_sentinel.hpp"
#include "tests/support/spec_bounds.hpp"

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using idemgate::test::fault::LocalStores;
using idemgate::test::ops::metric_value;
using idemgate::test::scale::describe_reply;
using idemgate::test::scale::RedisValue;
using idemgate::test::scale::SentinelTopology;
using Clock = std::chrono::steady_clock;

// -------------------------------------------------------------------------------------------
// Postgres of this binary alone (its Redis is unused: every gateway here follows the sentinels).

struct PrivateStores {
  PrivateStores() { instance = std::make_unique<LocalStores>(); }
  ~PrivateStores() { instance.reset(); }
  static inline std::unique_ptr<LocalStores> instance;
};

// -------------------------------------------------------------------------------------------
// Bounds. The only times asserted as bounds on the gateway are SPEC's, each with the margin of
// tests/support/spec_bounds.hpp: a request that meets a store fault is answered once its store
// operation ran out its operation_timeout (C25), and keyed requests succeed again within 1 s of
// the promotion (C41). Everything else is awaited as an event, kEventDeadline being only the
// safety net against a hang.

constexpr auto kRedisTimeout = 500ms;  ///< storage.redis.operation_timeout of every gateway
/// SPEC C25: operation_timeout plus spec::kStoreFaultMargin.
constexpr auto kStoreFaultBound = kRedisTimeout + spec::kStoreFaultMargin;
/// SPEC C41: 1 s after the promotion plus spec::kAfterPromotionMargin.
constexpr auto kAfterPromotionBound = spec::kAfterPromotion + spec::kAfterPromotionMargin;
constexpr auto kClientTimeout = kEventDeadline;  ///< safety net on every request
constexpr auto kRetryInterval = 20ms;            ///< between requests of one polling client
constexpr auto kLoadPace = 20ms;                 ///< between keys of one load thread
constexpr int kInstances = 2;                    ///< gateway processes per scenario
constexpr int kLoadThreads = 4;                  ///< load clients, split over the instances
const std::string kGatewayProblems = "https://idemgate.dev/problems/";

std::int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

void report(const std::string& scenario, std::uint64_t executions, std::uint64_t distinct_keys) {
  std::cout << "scenario=" << scenario << " executions=" << executions
            << " distinct_keys=" << distinct_keys << std::endl;
}

/// A response, or the client's error, and when the exchange started and ended.
struct Timed {
  HttpResponse response;
  std::string error;  ///< non-empty: no response (timeout, reset)
  int instance = 0;
  Clock::time_point start;
  Clock::time_point done;
  Clock::duration elapsed() const { return done - start; }
};

Timed send_timed(const Gateway& gateway, const HttpRequest& request, int instance) {
  Timed t;
  t.instance = instance;
  t.start = Clock::now();
  try {
    t.response = http_request(kLoopback, gateway.port(instance), request, kClientTimeout);
  } catch (const std::exception& e) {
    t.error = e.what();
  }
  t.done = Clock::now();
  return t;
}

HttpRequest payment_post(const std::string& host, const std::string& key) {
  return keyed_post("/payments", key, payment_body(unique_name("pay-c41")), {{"Host", host}});
}

bool replayed(const HttpResponse& r) {
  return r.header("Idempotent-Replayed").value_or("") == "true";
}

bool success(const HttpResponse& r) {
  return r.status == 200 || r.status == 201;
}

/// Executed now by the upstream under the contract: its own success, not a replay and not an
/// unprotected forward.
bool executed(const HttpResponse& r) {
  return success(r) && !replayed(r) && !r.header("Idempotency-Status").has_value();
}

/// 409 problem+json of type request-in-flight with Retry-After (C18).
bool in_flight(const HttpResponse& r) {
  return r.status == 409 && problem_type(r) == kGatewayProblems + "request-in-flight" &&
         r.header("Retry-After").has_value();
}

/// 503 problem+json of type store-unavailable with Retry-After (C25 fail_closed).
bool store_unavailable(const HttpResponse& r) {
  return r.status == 503 && problem_type(r) == kGatewayProblems + "store-unavailable" &&
         r.header("Retry-After").has_value();
}

/// What an answer during and after a failover may be (C41): executed, a replay, 409 or 503.
std::string kind_of(const Timed& t) {
  if (!t.error.empty()) return "no-answer";
  if (executed(t.response)) return "executed";
  if (success(t.response) && replayed(t.response)) return "replayed";
  if (in_flight(t.response)) return "409";
  if (store_unavailable(t.response)) return "503";
  return "other-" + std::to_string(t.response.status);
}

bool allowed_kind(const std::string& kind) {
  return kind == "executed" || kind == "replayed" || kind == "409" || kind == "503";
}

std::string summary(const std::map<std::string, int>& kinds) {
  std::string out;
  for (const auto& [kind, n] : kinds)
    out += (out.empty() ? "" : " ") + kind + "=" + std::to_string(n);
  return out;
}

// -------------------------------------------------------------------------------------------
// The admin endpoint of each instance (its port: Gateway::admin_port).

std::vector<json::object> log_lines(const std::string& text, const std::string& msg) {
  std::vector<json::object> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    json::error_code ec;
    const json::value v = json::parse(line, ec);
    if (ec || !v.is_object()) continue;
    const auto* m = v.as_object().if_contains("msg");
    if (m && m->is_string() && m->as_string() == msg) out.push_back(v.as_object());
  }
  return out;
}

std::string field(const json::object& line, const char* name) {
  const auto* v = line.if_contains(name);
  return v && v->is_string() ? std::string(v->as_string()) : "";
}

HttpResponse admin_get(const Gateway& gateway, int instance, const std::string& path) {
  HttpRequest request;
  request.target = path;
  return http_request(kLoopback, gateway.admin_port(instance), request, kClientTimeout);
}

std::optional<double> metric(const Gateway& gateway, int instance, const std::string& name,
                             const std::map<std::string, std::string>& labels = {}) {
  return metric_value(admin_get(gateway, instance, "/metrics").body, name, labels);
}

std::optional<double> failovers(const Gateway& gateway, int instance) {
  return metric(gateway, instance, "idemgate_store_failovers_total", {{"store", "redis"}});
}

/// idemgate_duplicate_executions_total summed over the instances (C36).
std::uint64_t duplicates(const Gateway& gateway) {
  double sum = 0;
  for (int i = 0; i < gateway.instances(); ++i)
    sum += metric(gateway, i, "idemgate_duplicate_executions_total").value_or(0);
  return static_cast<std::uint64_t>(sum);
}

// -------------------------------------------------------------------------------------------
// Configuration.

std::string route(const std::string& name, const std::string& host, const std::string& upstream) {
  return "  - name: " + name + "\n    match: { host: " + host +
         ", path_prefix: /payments, methods: [POST] }\n    upstream: " + upstream +
         "\n    idempotency: { mode: required, methods: [POST], lock_ttl: 30s, "
         "on_store_error: fail_closed }\n";
}

/// One route (`host` → `payments`) on a gateway that follows `topology`'s sentinels;
/// `redis_extra` is appended to storage.redis.
GatewayConfig sentinel_config(const SentinelTopology& topology, const PaymentService& payments,
                              const std::string& host, const std::string& redis_extra = "") {
  GatewayConfig config;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml = route("c41-" + host.substr(0, host.find('.')), host, "payments");
  config.redis = topology.gateway_redis() + redis_extra;
  config.redis_operation_timeout = std::to_string(kRedisTimeout.count()) + "ms";
  return config;
}

/// One keyed request per instance must execute: the gateway serves through the sentinels'
/// primary before any failover.
void warm_up(const Gateway& gateway, const std::string& host) {
  for (int i = 0; i < gateway.instances(); ++i) {
    const Timed t = send_timed(gateway, payment_post(host, unique_name("c41-warm")), i);
    BOOST_REQUIRE_MESSAGE(t.error.empty(), "warm-up on instance " << i << ": " << t.error << "\n"
                                                                  << gateway.diagnostics());
    BOOST_REQUIRE_MESSAGE(executed(t.response), "warm-up on instance "
                                                    << i << " did not execute:\n"
                                                    << gateway.explain(t.response));
  }
}

/// Sends new keys to `instance` every kRetryInterval until one executes; returns that answer
/// (or the last one when `deadline` passed first).
Timed poll_until_executed(const Gateway& gateway, int instance, const std::string& host,
                          Clock::time_point deadline, std::map<std::string, int>& kinds) {
  for (;;) {
    const Timed t = send_timed(gateway, payment_post(host, unique_name("c41-poll")), instance);
    ++kinds[kind_of(t)];
    if ((t.error.empty() && executed(t.response)) || Clock::now() > deadline) return t;
    std::this_thread::sleep_for(kRetryInterval);
  }
}

// -------------------------------------------------------------------------------------------
// Steady keyed load: each thread sends new keys to its instance and retries every answered key
// once through the other instance.

struct KeyRecord {
  HttpRequest request;
  std::vector<Timed> answers;
};

class KeyedLoad {
 public:
  KeyedLoad(const Gateway& gateway, std::string host) : gateway_(gateway), host_(std::move(host)) {}
  ~KeyedLoad() { stop(); }
  KeyedLoad(const KeyedLoad&) = delete;
  KeyedLoad& operator=(const KeyedLoad&) = delete;

  void start() {
    for (int t = 0; t < kLoadThreads; ++t) threads_.emplace_back([this, t] { run(t); });
  }

  void stop() {
    stopping_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  /// Answers recorded so far that executed.
  std::size_t executions() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& r : records_)
      for (const auto& a : r.answers) n += a.error.empty() && executed(a.response);
    return n;
  }

  /// The end of the first execution on `instance` of a request sent after `after`.
  std::optional<Clock::time_point> first_execution(int instance, Clock::time_point after) const {
    std::lock_guard lock(mutex_);
    std::optional<Clock::time_point> first;
    for (const auto& r : records_) {
      for (const auto& a : r.answers) {
        if (a.instance != instance || a.start < after || !a.error.empty() || !executed(a.response))
          continue;
        if (!first || a.done < *first) first = a.done;
      }
    }
    return first;
  }

  /// Every key with its answers, once stopped.
  const std::vector<KeyRecord>& records() const { return records_; }

 private:
  void run(int thread) {
    const int instance = thread % kInstances;
    while (!stopping_) {
      KeyRecord record;
      record.request = payment_post(host_, unique_name("c41-load"));
      record.answers.push_back(send_timed(gateway_, record.request, instance));
      if (record.answers.back().error.empty())
        record.answers.push_back(send_timed(gateway_, record.request, (instance + 1) % kInstances));
      {
        std::lock_guard lock(mutex_);
        records_.push_back(std::move(record));
      }
      std::this_thread::sleep_for(kLoadPace);
    }
  }

  const Gateway& gateway_;
  std::string host_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  mutable std::mutex mutex_;
  std::vector<KeyRecord> records_;
};

/// Waits until the load has executed `n` requests; false after kEventDeadline.
bool wait_for_executions(const KeyedLoad& load, std::size_t n) {
  const auto deadline = Clock::now() + kEventDeadline;
  while (load.executions() < n) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(kRetryInterval);
  }
  return true;
}

/// Waits until every instance executed a request sent after `after`; returns each instance's
/// first such moment (nullopt for one that did not within kEventDeadline of `after`).
std::vector<std::optional<Clock::time_point>> wait_for_recovery(const KeyedLoad& load,
                                                                Clock::time_point after) {
  std::vector<std::optional<Clock::time_point>> first(kInstances);
  const auto deadline = after + kEventDeadline;
  for (;;) {
    bool all = true;
    for (int i = 0; i < kInstances; ++i) {
      if (!first[i]) first[i] = load.first_execution(i, after);
      all &= first[i].has_value();
    }
    if (all || Clock::now() > deadline) return first;
    std::this_thread::sleep_for(kRetryInterval);
  }
}

/// What the load's answers add up to.
struct LoadTally {
  std::map<std::string, int> kinds;
  std::size_t keys_answered_2xx = 0;  ///< keys with at least one 2xx answer
  std::int64_t slowest_ms = 0;
};

/// Checks every answer of `records`: an answer at all, of an allowed kind (C41), within
/// `bound` (a SPEC C25 bound: kStoreFaultBound). Counts them by kind.
LoadTally check_answers(const std::vector<KeyRecord>& records, Clock::duration bound,
                        const Gateway& gateway) {
  LoadTally tally;
  int reported = 0;
  for (const auto& record : records) {
    bool answered_2xx = false;
    for (const auto& a : record.answers) {
      const std::string kind = kind_of(a);
      ++tally.kinds[kind];
      tally.slowest_ms = std::max(tally.slowest_ms, ms(a.elapsed()));
      answered_2xx |= a.error.empty() && success(a.response);
      const bool ok = allowed_kind(kind) && a.done - a.start <= bound;  // SPEC C25
      if (!ok && reported++ < 5) {
        BOOST_TEST(allowed_kind(kind), "answer of kind " << kind << " on instance " << a.instance
                                                         << ": " << a.error << "\n"
                                                         << describe(a.response));
        BOOST_TEST(ms(a.elapsed()) <= ms(bound),  // SPEC C25
                   "answered after " << ms(a.elapsed()) << " ms");
      } else if (!ok) {
        BOOST_TEST(ok);  // counted, not described again
      }
    }
    tally.keys_answered_2xx += answered_2xx;
  }
  if (reported) BOOST_TEST_MESSAGE(gateway.diagnostics());
  return tally;
}

/// Every key answered 2xx is replayed now, byte for byte the first 2xx answer (C16, C36),
/// through the instance that did not give that answer. Returns how many keys were checked.
std::size_t check_replays(const std::vector<KeyRecord>& records, const Gateway& gateway) {
  std::size_t checked = 0;
  int reported = 0;
  for (const auto& record : records) {
    const Timed* first = nullptr;
    for (const auto& a : record.answers) {
      if (a.error.empty() && success(a.response)) {
        first = &a;
        break;
      }
    }
    if (!first) continue;
    ++checked;
    const Timed again = send_timed(gateway, record.request, (first->instance + 1) % kInstances);
    const bool same = again.error.empty() && replayed(again.response) &&
                      again.response.status == first->response.status &&
                      again.response.body == first->response.body;
    if (!same && reported++ < 5) {
      BOOST_TEST(same,
                 "the retry of an answered key is not the replay of its first answer; first:\n"
                     << describe(first->response) << "\nretry: " << again.error << "\n"
                     << describe(again.response));
    } else if (!same) {
      BOOST_TEST(same);
    }
  }
  return checked;
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(PrivateStores);

// -------------------------------------------------------------------------------------------
// The topology itself

BOOST_AUTO_TEST_CASE(sentinel_topology_promotes_the_replica_and_takes_the_old_primary_back) {
  SentinelTopology topology;
  const auto old_primary = topology.primary_port();
  const auto old_replica = topology.replica_port();
  BOOST_TEST(topology.node_command(old_primary, {"ROLE"}).elements.at(0).str == "master");

  const auto killed = topology.kill_primary();
  const auto promoted = topology.wait_for_promotion();
  BOOST_TEST(topology.primary_port() == old_replica);
  BOOST_TEST(topology.node_command(old_replica, {"ROLE"}).elements.at(0).str == "master");

  const auto agreed = topology.wait_until_all_sentinels_agree();
  topology.restart_old_primary();
  const RedisValue role = topology.node_command(old_primary, {"ROLE"});
  BOOST_TEST(role.elements.at(0).str == "slave", describe_reply(role));
  BOOST_TEST(role.elements.at(2).integer == old_replica, describe_reply(role));
  std::cout << "figures scenario=sentinel_topology kill_to_promotion_ms=" << ms(promoted - killed)
            << " promotion_to_all_sentinels_ms=" << ms(agreed - promoted) << std::endl;
}

// -------------------------------------------------------------------------------------------
// C41 — following the primary

BOOST_AUTO_TEST_CASE(
    spec_C41_primary_killed_under_load_keyed_requests_succeed_within_1s_of_promotion) {
  SentinelTopology topology;
  PaymentService payments;
  Gateway gateway(sentinel_config(topology, payments, "load.test"), kInstances);
  warm_up(gateway, "load.test");
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");

  KeyedLoad load(gateway, "load.test");
  load.start();
  BOOST_REQUIRE_MESSAGE(wait_for_executions(load, 10), "no steady load\n" << gateway.diagnostics());
  const auto killed = topology.kill_primary();
  // No primary answers until the promotion: not ready (C30, C41). A probe counts when the
  // replica still says it is a replica after the probe's answer: no primary existed while it
  // ran. Each instance is probed until one of its probes counts, or the promotion came first.
  std::vector<std::optional<unsigned>> ready_during(kInstances);
  const auto replica = topology.replica_port();
  bool promotion_seen = false;
  for (int i = 0; i < kInstances && !promotion_seen; ++i) {
    while (!ready_during[i]) {
      const unsigned status = admin_get(gateway, i, "/readyz").status;
      if (topology.node_command(replica, {"ROLE"}).elements.at(0).str != "slave") {
        promotion_seen = true;
        break;
      }
      ready_during[i] = status;
    }
  }
  const auto promoted = topology.wait_for_promotion();
  const auto agreed = topology.wait_until_all_sentinels_agree();
  const auto recovered = wait_for_recovery(load, killed);
  std::this_thread::sleep_for(500ms);  // some load after the recovery too
  load.stop();

  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i << " /readyz") {
      BOOST_TEST_REQUIRE(
          ready_during[i].has_value(),
          "the promotion came before /readyz answered: not probed without a primary");
      BOOST_TEST(*ready_during[i] == 503u, "ready while no primary was reachable");
      const HttpResponse ready = admin_get(gateway, i, "/readyz");
      BOOST_TEST(ready.status == 200u, describe(ready));
    }
  }

  std::string recovery_figures;
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i) {
      BOOST_REQUIRE_MESSAGE(recovered[i].has_value(),
                            "no keyed request executed after the failover\n"
                                << gateway.diagnostics());
      const auto after = *recovered[i] - promoted;
      BOOST_TEST(ms(after) <= ms(kAfterPromotionBound),  // SPEC C41
                 "first execution " << ms(after) << " ms after the promotion\n"
                                    << gateway.diagnostics());
      recovery_figures += " instance" + std::to_string(i) +
                          "_first_success_after_promotion_ms=" + std::to_string(ms(after));
    }
  }

  const LoadTally tally = check_answers(load.records(), kStoreFaultBound, gateway);  // SPEC C25
  const std::size_t replays_checked = check_replays(load.records(), gateway);
  const auto executions = payments.counter("payment_posts") - posts;
  const auto payments_made = payments.counter("payments_inserted") - inserted;
  const auto dups = duplicates(gateway);
  // Every key has its own payment: the payment service's UNIQUE keeps one payment per key, so
  // payments made are the keys that executed at least once.
  BOOST_TEST(payments_made == tally.keys_answered_2xx, "a key executed without a 2xx answer");
  BOOST_TEST(executions <= tally.keys_answered_2xx + dups,
             "more executions than answered keys plus the duplicates the gateways counted");
  report("C41_primary_killed_under_load", executions, tally.keys_answered_2xx);
  std::cout << "figures scenario=C41_primary_killed_under_load kill_to_promotion_ms="
            << ms(promoted - killed) << " promotion_to_all_sentinels_ms=" << ms(agreed - promoted)
            << recovery_figures << " keys=" << load.records().size() << " " << summary(tally.kinds)
            << " slowest_answer_ms=" << tally.slowest_ms << " replays_checked=" << replays_checked
            << " duplicates=" << dups << std::endl;
}

BOOST_AUTO_TEST_CASE(spec_C41_wait_replicas_1_keeps_every_lock_when_the_primary_dies_mid_request) {
  constexpr int kInFlight = 4;
  SentinelTopology topology;
  PaymentService fast;
  // The requests in flight at the failover wait at this upstream until the test lets them go,
  // once their duplicates were answered: in flight then however long the failover takes. Its
  // request_timeout is beyond every safety net, so that only the release ends the wait.
  TestUpstream slow;
  UpstreamReply held;
  held.hold = true;
  slow.on("/payments", {held});
  GatewayConfig config = sentinel_config(topology, fast, "fast.test", ", wait_replicas: 1");
  config.upstreams.push_back({"slow", {slow.address()}, "1s", "600s"});
  config.routes_yaml += route("c41-slow", "slow.test", "slow");
  Gateway gateway(config, kInstances);
  warm_up(gateway, "fast.test");
  const auto fast_posts = fast.counter("payment_posts");
  const auto fast_inserted = fast.counter("payments_inserted");

  KeyedLoad load(gateway, "fast.test");
  load.start();
  BOOST_REQUIRE_MESSAGE(wait_for_executions(load, 10), "no steady load\n" << gateway.diagnostics());

  // Requests at the upstream when the primary dies: their locks were acknowledged by the
  // replica (WAIT 1) before they were forwarded.
  std::vector<HttpRequest> slow_requests;
  std::vector<std::future<Timed>> originals;
  for (int i = 0; i < kInFlight; ++i) {
    slow_requests.push_back(payment_post("slow.test", unique_name("c41-inflight")));
    originals.push_back(
        std::async(std::launch::async, [&gateway, request = slow_requests.back(), i] {
          return send_timed(gateway, request, i % kInstances);
        }));
  }
  BOOST_REQUIRE_MESSAGE(slow.wait_for("/payments", kInFlight),
                        "the in-flight requests never reached the upstream\n"
                            << gateway.diagnostics());
  const auto killed = topology.kill_primary();
  const auto promoted = topology.wait_for_promotion();
  // WAIT 1 needs a replica again: the old primary returns as the new primary's replica.
  topology.restart_old_primary();
  const auto replica_back = Clock::now();

  // The same keys again, through the other instance, while the originals are held upstream:
  // the promoted primary holds their locks, so none may execute (409).
  // A 503 (the gateway not back yet) proves nothing: send again until the gateway decides.
  std::map<std::string, int> duplicate_kinds;
  for (int i = 0; i < kInFlight; ++i) {
    const auto deadline = Clock::now() + kEventDeadline;
    for (;;) {
      const Timed t = send_timed(gateway, slow_requests[i], (i + 1) % kInstances);
      const std::string kind = kind_of(t);
      ++duplicate_kinds[kind];
      if (kind == "503" && Clock::now() < deadline) {
        std::this_thread::sleep_for(kRetryInterval);
        continue;
      }
      BOOST_TEST(kind == "409", "a duplicate of an in-flight key got " << kind << "\n"
                                                                       << describe(t.response)
                                                                       << "\n"
                                                                       << gateway.diagnostics());
      break;
    }
  }
  BOOST_TEST(slow.count("/payments") == static_cast<std::size_t>(kInFlight),
             "a duplicate of an in-flight key reached the upstream");
  for (int i = 0; i < kInFlight; ++i) {
    BOOST_TEST((originals[i].wait_for(0s) == std::future_status::timeout),
               "in-flight original " << i << " was answered while its upstream held it");
  }
  slow.release();
  const auto released = Clock::now();

  const auto recovered = wait_for_recovery(load, replica_back);
  std::vector<KeyRecord> in_flight_records;
  std::int64_t slowest_after_release_ms = 0;
  for (int i = 0; i < kInFlight; ++i) {
    KeyRecord record{slow_requests[i], {originals[i].get()}};
    const Timed& t = record.answers.front();
    slowest_after_release_ms = std::max(slowest_after_release_ms, ms(t.done - released));
    BOOST_TEST(executed(t.response), "in-flight original " << i << ": " << t.error << "\n"
                                                           << gateway.explain(t.response));
    // SPEC C25: once the upstream answered, the answer waits on no store operation past its
    // operation_timeout.
    BOOST_TEST(ms(t.done - released) <= ms(kStoreFaultBound),  // SPEC C25
               "the in-flight original was answered " << ms(t.done - released)
                                                      << " ms after the upstream's answer");
    in_flight_records.push_back(std::move(record));
  }
  load.stop();

  std::string recovery_figures;
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST(recovered[i].has_value(), "instance " << i
                                                     << " executed nothing after the failover\n"
                                                     << gateway.diagnostics());
    if (recovered[i])
      recovery_figures += " instance" + std::to_string(i) +
                          "_first_success_after_replica_back_ms=" +
                          std::to_string(ms(*recovered[i] - replica_back));
  }
  // Requests the WAIT holds may take operation_timeout for the WAIT itself (SPEC C41, C25).
  const LoadTally tally = check_answers(load.records(), kStoreFaultBound, gateway);
  const std::size_t replays_checked =
      check_replays(load.records(), gateway) + check_replays(in_flight_records, gateway);
  // Every execution of the held upstream is a payment of its own key: no second layer there.
  const auto executions = fast.counter("payment_posts") - fast_posts + slow.count("/payments");
  const auto payments_made =
      fast.counter("payments_inserted") - fast_inserted + slow.count("/payments");
  const std::size_t distinct_keys = tally.keys_answered_2xx + kInFlight;
  const auto dups = duplicates(gateway);
  BOOST_TEST(executions == distinct_keys, "upstream executions differ from the keys answered 2xx");
  BOOST_TEST(payments_made == distinct_keys);
  BOOST_TEST(dups == 0u, "the gateways counted duplicate executions");
  report("C41_wait_replicas_1_primary_killed_mid_request", executions, distinct_keys);
  std::cout << "figures scenario=C41_wait_replicas_1_primary_killed_mid_request"
            << " kill_to_promotion_ms=" << ms(promoted - killed)
            << " promotion_to_replica_back_ms=" << ms(replica_back - promoted) << recovery_figures
            << " keys=" << load.records().size() + kInFlight << " load: " << summary(tally.kinds)
            << " in_flight_duplicates: " << summary(duplicate_kinds)
            << " in_flight_answered_after_release_ms=" << slowest_after_release_ms
            << " slowest_answer_ms=" << tally.slowest_ms << " replays_checked=" << replays_checked
            << " duplicates=" << dups << std::endl;
}

BOOST_AUTO_TEST_CASE(spec_C41_wait_replicas_1_fewer_acks_is_a_store_error_and_releases_the_lock) {
  SentinelTopology topology;
  PaymentService payments;
  Gateway gateway(sentinel_config(topology, payments, "acks.test", ", wait_replicas: 1"), 1);
  warm_up(gateway, "acks.test");
  const auto posts = payments.counter("payment_posts");
  const std::string key = unique_name("c41-acks");
  const HttpRequest request = payment_post("acks.test", key);
  const std::string lock = lock_key(record_id_hex("c41-acks", key));

  // A frozen replica acknowledges nothing: WAIT 1 runs out, the lock does not count.
  topology.signal_node(topology.replica_port(), SIGSTOP);
  const Timed refused = send_timed(gateway, request, 0);
  const auto lock_left = topology.node_command(topology.primary_port(), {"EXISTS", lock}).integer;
  topology.signal_node(topology.replica_port(), SIGCONT);
  BOOST_TEST(store_unavailable(refused.response), refused.error
                                                      << "\n"
                                                      << gateway.explain(refused.response));
  // SPEC C41: WAIT counts the acknowledgements within operation_timeout; then C25.
  BOOST_TEST(ms(refused.elapsed()) <= ms(kStoreFaultBound),  // SPEC C41, C25
             "answered after " << ms(refused.elapsed()) << " ms");
  BOOST_TEST(payments.counter("payment_posts") == posts, "forwarded without the replica's ack");
  BOOST_TEST(lock_left == 0, "the lock was not released after too few acknowledgements");

  // Released, not left to expire (lock_ttl 30 s): the retry executes as soon as the replica
  // acknowledges again.
  std::map<std::string, int> kinds;
  Timed retry;
  const auto deadline = Clock::now() + kEventDeadline;
  do {
    retry = send_timed(gateway, request, 0);
    ++kinds[kind_of(retry)];
  } while (kind_of(retry) == "503" && Clock::now() < deadline &&
           (std::this_thread::sleep_for(kRetryInterval), true));
  BOOST_TEST(executed(retry.response), gateway.explain(retry.response));
  BOOST_TEST(!kinds.contains("409"), "the refused request left its lock behind");
  const auto executions = payments.counter("payment_posts") - posts;
  BOOST_TEST(executions == 1u);
  report("C41_wait_replicas_fewer_acks", executions, 1);
  std::cout << "figures scenario=C41_wait_replicas_fewer_acks refused_after_ms="
            << ms(refused.elapsed()) << " retries: " << summary(kinds) << std::endl;
}

// SPEC C41 "fewer → store error, lock released", for every request refused while the replica is
// away. On one io thread the four writes and WAITs share a connection, and Redis runs a WAIT only
// after the previous one returned: the second WAIT outlives operation_timeout, the gateway gives
// up on that connection and answers 503, but that request's SET had already run. Its token must
// go as soon as Redis answers again, or the retry meets it (409) until lock_ttl (30 s).
BOOST_AUTO_TEST_CASE(spec_C41_wait_replicas_1_no_request_refused_for_too_few_acks_keeps_its_lock) {
  constexpr std::size_t kRequests = 4;
  SentinelTopology topology;
  PaymentService payments;
  GatewayConfig config = sentinel_config(topology, payments, "acks4.test", ", wait_replicas: 1");
  config.threads = 1;
  Gateway gateway(config, 1);
  warm_up(gateway, "acks4.test");
  const auto posts = payments.counter("payment_posts");
  std::vector<HttpRequest> requests;
  for (std::size_t i = 0; i < kRequests; ++i)
    requests.push_back(payment_post("acks4.test", unique_name("c41-acks4")));

  topology.signal_node(topology.replica_port(), SIGSTOP);
  const auto refused = run_concurrently(kRequests, [&](std::size_t i) {
    return http_request(kLoopback, gateway.port(0), requests[i], kClientTimeout);
  });
  topology.signal_node(topology.replica_port(), SIGCONT);
  for (const auto& r : refused) {
    BOOST_TEST(r.error.empty(), r.error);
    BOOST_TEST(store_unavailable(r.response), gateway.explain(r.response));
  }
  BOOST_TEST(payments.counter("payment_posts") == posts, "forwarded without the replica's ack");

  // Each key again once the replica acknowledges: 503 until it does, never 409.
  std::map<std::string, int> kinds;
  for (const auto& request : requests) {
    Timed retry;
    const auto deadline = Clock::now() + kEventDeadline;
    do {
      retry = send_timed(gateway, request, 0);
      ++kinds[kind_of(retry)];
    } while (kind_of(retry) == "503" && Clock::now() < deadline &&
             (std::this_thread::sleep_for(kRetryInterval), true));
    BOOST_TEST(executed(retry.response), gateway.explain(retry.response));
  }
  BOOST_TEST(!kinds.contains("409"), "a refused request left its lock behind: " << summary(kinds));
  const auto executions = payments.counter("payment_posts") - posts;
  BOOST_TEST(executions == kRequests);
  report("C41_wait_replicas_fewer_acks_4_at_once", executions, kRequests);
  std::cout << "figures scenario=C41_wait_replicas_fewer_acks_4_at_once retries: " << summary(kinds)
            << std::endl;
}

BOOST_AUTO_TEST_CASE(spec_C41_sentinels_naming_a_replica_get_no_lock_command_and_requests_get_503) {
  SentinelTopology::Options options;
  options.monitor_replica = true;
  SentinelTopology topology(options);
  PaymentService payments;
  const std::uint16_t named = topology.replica_port();
  const auto keys_before = topology.node_command(named, {"DBSIZE"}).integer;
  const auto commands_before = topology.node_command(named, {"INFO", "commandstats"}).str;
  const auto posts = payments.counter("payment_posts");

  Gateway gateway(sentinel_config(topology, payments, "replica.test"), 1);
  std::map<std::string, int> kinds;
  for (int i = 0; i < 3; ++i) {
    const Timed t =
        send_timed(gateway, payment_post("replica.test", unique_name("c41-replica")), 0);
    ++kinds[kind_of(t)];
    BOOST_TEST(store_unavailable(t.response), t.error << "\n" << gateway.explain(t.response));
    BOOST_TEST(ms(t.elapsed()) <= ms(kStoreFaultBound),  // SPEC C25
               "answered after " << ms(t.elapsed()) << " ms");
  }
  const HttpResponse ready = admin_get(gateway, 0, "/readyz");
  BOOST_TEST(ready.status == 503u, describe(ready));
  BOOST_TEST(payments.counter("payment_posts") == posts, "the upstream was called");

  // The replica refuses writes (READONLY), so its keys cannot tell; its command counters can:
  // a command the gateway sent counts there even when refused.
  // `cmdstat_NAME:calls=N,usec=…,rejected_calls=R,failed_calls=F` → NAME: N + R + F.
  const auto totals = [](const std::string& info) {
    std::map<std::string, long long> out;
    std::istringstream lines(info);
    std::string line;
    while (std::getline(lines, line)) {
      const auto colon = line.find(':');
      if (!line.starts_with("cmdstat_") || colon == std::string::npos) continue;
      long long total = 0;
      std::istringstream counters(line.substr(colon + 1));
      std::string pair;
      while (std::getline(counters, pair, ',')) {
        const auto eq = pair.find('=');
        const std::string name = pair.substr(0, eq);
        if (name == "calls" || name == "rejected_calls" || name == "failed_calls")
          total += std::stoll(pair.substr(eq + 1));
      }
      out[line.substr(8, colon - 8)] = total;
    }
    return out;
  };
  // Sentinels, the replication link, this test and a gateway probing the node's role send these.
  const std::set<std::string> harmless = {"ping",  "info",    "role",      "auth",     "select",
                                          "hello", "publish", "subscribe", "replconf", "quit",
                                          "echo",  "command", "client"};
  const auto before = totals(commands_before);
  const auto after = totals(topology.node_command(named, {"INFO", "commandstats"}).str);
  std::vector<std::string> sent;
  for (const auto& [name, total] : after) {
    const std::string base = name.substr(0, name.find('|'));
    const auto it = before.find(name);
    if (total > (it == before.end() ? 0 : it->second) && !harmless.contains(base))
      sent.push_back(name);
  }
  BOOST_TEST(
      sent.empty(), "commands beyond a role check reached the replica: " << [&] {
        std::string s;
        for (const auto& n : sent) s += n + " ";
        return s;
      }() << "\n" << gateway.diagnostics());
  BOOST_TEST(topology.node_command(named, {"DBSIZE"}).integer == keys_before);
  // The sentinels never send ROLE (they read INFO): a rise is the gateway checking the node it
  // was given, which shows that the 503s come from that check and not from an earlier failure.
  const auto role_before = before.contains("role") ? before.at("role") : 0;
  BOOST_TEST((after.contains("role") && after.at("role") > role_before),
             "the gateway never asked the named node for its ROLE\n"
                 << gateway.diagnostics());
  std::string seen;
  for (const auto& [name, total] : after) {
    const auto it = before.find(name);
    const auto delta = total - (it == before.end() ? 0 : it->second);
    if (delta > 0) seen += (seen.empty() ? "" : ",") + name + ":" + std::to_string(delta);
  }
  report("C41_sentinels_name_a_replica", payments.counter("payment_posts") - posts, 0);
  std::cout << "figures scenario=C41_sentinels_name_a_replica " << summary(kinds)
            << " readyz=" << ready.status << " replica_saw=" << seen << std::endl;
}

BOOST_AUTO_TEST_CASE(spec_C41_every_reconnect_authenticates_after_a_failover) {
  SentinelTopology::Options options;
  options.password = "node-secret";
  options.sentinel_password = "sentinel-secret";
  SentinelTopology topology(options);
  PaymentService payments;
  Gateway gateway(sentinel_config(topology, payments, "auth.test"), kInstances);
  warm_up(gateway, "auth.test");
  const auto posts = payments.counter("payment_posts");

  KeyedLoad load(gateway, "auth.test");
  load.start();
  BOOST_REQUIRE_MESSAGE(wait_for_executions(load, 4), "no steady load\n" << gateway.diagnostics());
  const auto killed = topology.kill_primary();
  const auto promoted = topology.wait_for_promotion();
  const auto recovered = wait_for_recovery(load, killed);
  load.stop();

  std::string figures;
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i) {
      BOOST_REQUIRE_MESSAGE(recovered[i].has_value(),
                            "no keyed request executed after the failover\n"
                                << gateway.diagnostics());
      BOOST_TEST(ms(*recovered[i] - promoted) <= ms(kAfterPromotionBound),  // SPEC C41
                 gateway.diagnostics());
      figures += " instance" + std::to_string(i) + "_first_success_after_promotion_ms=" +
                 std::to_string(ms(*recovered[i] - promoted));
    }
  }
  const LoadTally tally = check_answers(load.records(), kStoreFaultBound, gateway);  // SPEC C25
  report("C41_auth_after_failover", payments.counter("payment_posts") - posts,
         tally.keys_answered_2xx);
  std::cout << "figures scenario=C41_auth_after_failover kill_to_promotion_ms="
            << ms(promoted - killed) << figures << " " << summary(tally.kinds) << std::endl;
}

// -------------------------------------------------------------------------------------------
// C46 — the switch counted and logged once per instance

// Asynchronous replication can lose a lock in the switch (wait_replicas 0). The loss is made
// certain here by deleting the lock keys on the promoted primary, as if the last writes never
// reached it: a retry of the in-flight key then executes a second time, and C36 must keep the
// first committed answer for both clients and count the duplicate.
BOOST_AUTO_TEST_CASE(
    spec_C36_a_lock_lost_in_the_failover_lets_one_duplicate_run_and_the_first_answer_is_kept) {
  SentinelTopology topology;
  TestUpstream upstream;
  // Both executions wait at the upstream until the test lets them go; every execution gets its
  // own body ({"path":…,"n":N}), so the answers tell which one was stored.
  UpstreamReply held;
  held.hold = true;
  upstream.on("/payments", {held, held});
  GatewayConfig config;
  config.upstreams = {{"payments", {upstream.address()}}};
  config.routes_yaml = route("c36-lost", "lost.test", "payments");
  config.redis = topology.gateway_redis();
  config.redis_operation_timeout = std::to_string(kRedisTimeout.count()) + "ms";
  Gateway gateway(config, kInstances);

  const HttpRequest request =
      keyed_post("/payments", unique_name("c36-lost"), "{\"amount\":1}", {{"Host", "lost.test"}});
  auto first = std::async(std::launch::async, [&] { return send_timed(gateway, request, 0); });
  BOOST_REQUIRE_MESSAGE(upstream.wait_for("/payments", 1),
                        "the first request never reached the upstream\n"
                            << gateway.diagnostics());

  topology.kill_primary();
  topology.wait_for_promotion();
  const auto locks = topology.node_command(topology.primary_port(), {"KEYS", "idemgate:lock:*"});
  BOOST_REQUIRE(locks.kind == RedisValue::Kind::array);
  BOOST_TEST_REQUIRE(locks.elements.size() == 1u,
                     "the promoted replica should hold the lock: " << describe_reply(locks));
  topology.node_command(topology.primary_port(), {"DEL", locks.elements[0].str});

  // The retry through the other instance: 503 until that instance found the new primary, then
  // it takes the (lost) lock and executes.
  auto second = std::async(std::launch::async, [&] {
    const auto deadline = Clock::now() + kEventDeadline;
    for (;;) {
      Timed t = send_timed(gateway, request, 1);
      if (kind_of(t) != "503" || Clock::now() > deadline) return t;
      std::this_thread::sleep_for(kRetryInterval);
    }
  });
  BOOST_REQUIRE_MESSAGE(upstream.wait_for("/payments", 2),
                        "the retry never executed after the lock was lost\n"
                            << gateway.diagnostics());
  upstream.release();
  const Timed a = first.get();
  const Timed b = second.get();
  BOOST_REQUIRE_MESSAGE(a.error.empty() && b.error.empty(), a.error << " / " << b.error);
  BOOST_TEST(a.response.status == 201u, gateway.explain(a.response));
  BOOST_TEST(b.response.status == 201u, gateway.explain(b.response));
  // One body for both clients: the first committed; the later commit lost and replays it.
  BOOST_TEST(a.response.body == b.response.body);
  BOOST_TEST((replayed(a.response) != replayed(b.response)),
             "exactly one of the two executions answers as a replay");
  BOOST_TEST(upstream.count("/payments") == 2u);
  BOOST_TEST(duplicates(gateway) == 1u, "C36 counts the duplicate execution once");
  // Later retries replay that same first answer.
  const Timed later = send_timed(gateway, request, 0);
  BOOST_TEST(replayed(later.response), gateway.explain(later.response));
  BOOST_TEST(later.response.body == a.response.body);
  BOOST_TEST(upstream.count("/payments") == 2u);
}

// C25 with the sentinels gone but the primary healthy: when no sentinel answers at all, the
// gateway keeps the primary it was using once that node still says ROLE master, so keyed
// requests go on after a dropped connection instead of failing until a sentinel returns.
BOOST_AUTO_TEST_CASE(spec_C41_sentinels_unreachable_keep_the_primary_that_still_says_master) {
  SentinelTopology topology;
  PaymentService payments;
  GatewayConfig config = sentinel_config(topology, payments, "quiet.test");
  config.threads = 1;  // one Redis client: the one whose command times out must recover
  Gateway gateway(config, 1);
  warm_up(gateway, "quiet.test");
  struct Resume {
    SentinelTopology& topology;
    ~Resume() { topology.signal_sentinels(SIGCONT); }
  } resume{topology};
  topology.signal_sentinels(SIGSTOP);
  // A command that times out on the primary makes the gateway look the primary up again.
  topology.signal_node(topology.primary_port(), SIGSTOP);
  const Timed stalled = send_timed(gateway, payment_post("quiet.test", unique_name("c41-q")), 0);
  topology.signal_node(topology.primary_port(), SIGCONT);
  BOOST_TEST(store_unavailable(stalled.response), gateway.explain(stalled.response));
  std::map<std::string, int> kinds;
  const Timed t =
      poll_until_executed(gateway, 0, "quiet.test", Clock::now() + kEventDeadline, kinds);
  BOOST_TEST(executed(t.response), "no keyed request executed while the sentinels were silent: "
                                       << summary(kinds) << "\n"
                                       << gateway.diagnostics());
  // SPEC C25 (with C41's lookup): the lookup gives up after one operation_timeout, the sentinel
  // it is asking then may run out its own, and the command follows on the primary.
  BOOST_TEST(ms(t.elapsed()) <= ms(kRedisTimeout + kStoreFaultBound),  // SPEC C25, C41
             "the request took " << ms(t.elapsed()) << " ms");
  BOOST_TEST(failovers(gateway, 0).value_or(-1) == 0.0, "no switch happened");
}

BOOST_AUTO_TEST_CASE(spec_C46_each_instance_counts_and_logs_the_switch_to_the_new_primary_once) {
  SentinelTopology topology;
  PaymentService payments;
  Gateway gateway(sentinel_config(topology, payments, "c46.test"), kInstances);
  warm_up(gateway, "c46.test");
  const std::string from = topology.primary_address();
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i << " before the failover") {
      BOOST_TEST(failovers(gateway, i).value_or(-1) == 0,
                 "idemgate_store_failovers_total{store=\"redis\"} is not exported as 0");
      BOOST_TEST(log_lines(gateway.stderr_text(i), "store failover").empty());
    }
  }

  topology.kill_primary();
  const auto promoted = topology.wait_for_promotion();
  const std::string to = topology.primary_address();
  std::map<std::string, int> kinds;
  for (int i = 0; i < kInstances; ++i) {
    const Timed t = poll_until_executed(gateway, i, "c46.test", promoted + kEventDeadline, kinds);
    BOOST_REQUIRE_MESSAGE(t.error.empty() && executed(t.response),
                          "instance " << i << " executed nothing after the failover\n"
                                      << gateway.explain(t.response));
    // More keys, so that every io thread's connection has met the new primary.
    for (int n = 0; n < 8; ++n) {
      const Timed more = send_timed(gateway, payment_post("c46.test", unique_name("c46")), i);
      ++kinds[kind_of(more)];
    }
  }

  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i << " after the failover") {
      BOOST_TEST(failovers(gateway, i).value_or(-1) == 1, gateway.diagnostics());
      const auto lines = log_lines(gateway.stderr_text(i), "store failover");
      BOOST_TEST(lines.size() == 1u, gateway.diagnostics());
      for (const auto& line : lines) {
        BOOST_TEST(field(line, "store") == "redis", json::serialize(line));
        BOOST_TEST(field(line, "from") == from, json::serialize(line));
        BOOST_TEST(field(line, "to") == to, json::serialize(line));
      }
    }
  }
  std::cout << "figures scenario=C46_failover_counted_once from=" << from << " to=" << to << " "
            << summary(kinds) << std::endl;
}

// The `keys` CLI runs the gateway's own Sentinel client: it finds the primary through the
// sentinels, shows the record with its committed marker, and purge deletes both, after which the
// key executes again.
BOOST_AUTO_TEST_CASE(keys_show_and_purge_reach_the_primary_the_sentinels_name) {
  SentinelTopology topology;
  PaymentService payments;
  Gateway gateway(sentinel_config(topology, payments, "cli.test"), 1);
  const std::string key = unique_name("c41-cli");
  const HttpRequest request = payment_post("cli.test", key);
  const std::string lock = lock_key(record_id_hex("c41-cli", key));

  const Timed first = send_timed(gateway, request, 0);
  BOOST_TEST_REQUIRE(executed(first.response), first.error << gateway.explain(first.response));
  BOOST_TEST_REQUIRE(eventually([&] {
    const RedisValue held = topology.node_command(topology.primary_port(), {"GET", lock});
    return held.kind == RedisValue::Kind::string && idemgate::core::is_replay_marker(held.str);
  }));

  const auto shown =
      run_keys(gateway.config_path(), gateway.dir(), {"show", "--route", "c41-cli", key});
  BOOST_TEST(shown.status == 0, shown.err);
  BOOST_TEST(shown.out.find("status 201\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("replay_marker present\n") != std::string::npos, shown.out);

  const auto purged =
      run_keys(gateway.config_path(), gateway.dir(), {"purge", "--route", "c41-cli", key});
  BOOST_TEST(purged.status == 0, purged.err);
  BOOST_TEST(purged.out.find("deleted record ") != std::string::npos, purged.out);
  BOOST_TEST(purged.out.find("deleted replay marker " + lock) != std::string::npos, purged.out);
  BOOST_TEST(topology.node_command(topology.primary_port(), {"EXISTS", lock}).integer == 0);
  const auto gone =
      run_keys(gateway.config_path(), gateway.dir(), {"show", "--route", "c41-cli", key});
  BOOST_TEST(gone.status == 1);
  BOOST_TEST(gone.out == "not found\n");

  const Timed again = send_timed(gateway, request, 0);
  BOOST_TEST(executed(again.response), again.error << gateway.explain(again.response));
}
