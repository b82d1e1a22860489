// Postgres failover (SPEC C43, C46): real `idemgate` and `payment-service` processes whose
// `storage.postgres.dsn` is libpq's multi-host form over a primary and its synchronous standby,
// which this binary starts on loopback, SIGKILLs and promotes under keyed load. Redis and the
// payment service's database come from scripts/local-stores: they do not fail over.
//
// Each scenario prints one line `scenario=<name> executions=<n> distinct_keys=<k>` (executions:
// the payment service's `payment_posts` delta, distinct_keys: keys that executed) and lines
// `figures scenario=<name> …` with the measured times and the answers by kind.
#define BOOST_TEST_MODULE pg_failover_scale
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/scale/pg_standby.hpp"
#include "tests/support/answers.hpp"
#include "tests/support/keyed_load.hpp"
#include "tests/support/local_stores.hpp"
#include "tests/support/scraping.hpp"
#include "tests/support/spec_bounds.hpp"

namespace {

using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using idemgate::test::scale::PgStandbyPair;

// -------------------------------------------------------------------------------------------
// Bounds. The only times asserted as bounds on the gateway are SPEC's, from the configuration
// below, each with the margin of tests/support/spec_bounds.hpp. Everything else is awaited as an
// event, kEventDeadline being only the safety net against a hang.

constexpr auto kPgTimeout = 1s;       ///< storage.postgres.operation_timeout
constexpr auto kCommitTimeout = 10s;  ///< idempotency.commit_timeout (C26)
/// SPEC C25: a request that meets the outage is answered once its Postgres operation ran out its
/// operation_timeout (plus spec::kStoreFaultMargin).
constexpr auto kStoreFaultBound = kPgTimeout + spec::kStoreFaultMargin;
/// SPEC C26 with C25: a request whose record commit meets the outage waits for the commit's
/// retries up to commit_timeout; the attempt running then may take its operation_timeout.
constexpr auto kAnswerBound = kCommitTimeout + kStoreFaultBound;
/// SPEC C43: new keys execute within 1 s of the promotion (plus spec::kAfterPromotionMargin).
constexpr auto kAfterPromotionBound = spec::kAfterPromotion + spec::kAfterPromotionMargin;
constexpr auto kRetryInterval = 20ms;  ///< between requests of one polling client
constexpr auto kLoadPace = 10ms;       ///< between keys of one load thread
constexpr auto kOutage = 500ms;        ///< from the primary's death to the promotion
constexpr int kPaymentDelayMs = 30;    ///< keeps requests at the upstream when the primary dies
constexpr int kInstances = 2;          ///< gateway processes per scenario
constexpr int kLoadThreads = 4;        ///< load clients, split over the instances

HttpRequest payment_post(const std::string& host, const std::string& key) {
  return keyed_post("/payments", key, payment_body(unique_name("pay-c43")), {{"Host", host}});
}

// -------------------------------------------------------------------------------------------
// Configuration.

/// A keyed route `host`/`path` → `upstream`. Without the committed marker (replay_cache_ttl 0s)
/// every replay reads its record from Postgres, so a replay proves the record survived.
std::string route(const std::string& name, const std::string& host, const std::string& path,
                  const std::string& upstream) {
  return "  - name: " + name + "\n    match: { host: " + host + ", path_prefix: " + path +
         ", methods: [POST] }\n    upstream: " + upstream +
         "\n    idempotency: { mode: required, methods: [POST], lock_ttl: 30s, "
         "on_store_error: fail_closed, commit_timeout: " +
         std::to_string(std::chrono::seconds(kCommitTimeout).count()) +
         "s, replay_cache_ttl: 0s }\n";
}

/// Gateways over `pair` (its multi-host DSN), one route to `payments` for `host`.
GatewayConfig failover_config(const PgStandbyPair& pair, const PaymentService& payments,
                              const std::string& host) {
  // The fixture takes the gateway's DSN from the environment; the payment service keeps the
  // private stores' database (IDEMGATE_PAYMENTS_DSN).
  ::setenv("IDEMGATE_PG_DSN", pair.multi_host_dsn().c_str(), 1);
  GatewayConfig config;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml =
      route("c43-" + host.substr(0, host.find('.')), host, "/payments", "payments");
  config.postgres_operation_timeout = std::to_string(ms(kPgTimeout)) + "ms";
  return config;
}

/// One keyed request per instance must execute before any failover.
void warm_up(const Gateway& gateway, const std::string& host) {
  idemgate::test::warm_up(gateway, [&] { return payment_post(host, unique_name("c43-warm")); });
}

// -------------------------------------------------------------------------------------------
// Keyed load: each thread sends distinct new keys to its instance, once each, and records the
// answer its client got; the checks' retries add theirs.

KeyedLoad::Options load_on(const Gateway& gateway, const std::string& host) {
  auto options =
      KeyedLoad::on(gateway, [host] { return payment_post(host, unique_name("c43-load")); });
  options.threads = kLoadThreads;
  options.pace = kLoadPace;
  return options;
}

/// Sends a new key to `instance` every kRetryInterval until one executes (or kEventDeadline
/// passed); returns every key sent with its answer, the executed one last.
std::vector<KeyRecord> poll_until_executed(const Gateway& gateway, int instance,
                                           const std::string& host) {
  std::vector<KeyRecord> sent;
  eventually(
      [&] {
        KeyRecord record{payment_post(host, unique_name("c43-poll")), {}};
        record.answers.push_back(send_timed(gateway, record.request, instance));
        sent.push_back(std::move(record));
        const Timed& t = sent.back().answers.back();
        return t.answered() && executed(t.response);
      },
      kRetryInterval);
  return sent;
}

/// Checks one answer: there is one, of a kind allowed during a failover, and within kAnswerBound
/// (no request hangs on a store, SPEC C25, C26). Reports at most a few failures in full.
void check_answer(const Timed& a, std::map<std::string, int>& kinds, int& reported,
                  const Gateway& gateway) {
  const std::string kind = kind_of(a);
  ++kinds[kind];
  const bool ok = allowed_kind(kind) && a.elapsed() <= kAnswerBound;  // SPEC C25, C26
  if (ok) return;
  if (reported++ < 5) {
    BOOST_TEST(allowed_kind(kind), "answer of kind " << kind << " on instance " << a.instance
                                                     << ": " << a.error << "\n"
                                                     << describe(a.response) << "\n"
                                                     << gateway.diagnostics());
    BOOST_TEST(ms(a.elapsed()) <= ms(kAnswerBound),  // SPEC C25, C26
               "answered after " << ms(a.elapsed()) << " ms");
  } else {
    BOOST_TEST(ok);  // counted, not described again
  }
}

/// The figures of one failover under load.
struct FailoverOutcome {
  std::size_t keys = 0;
  std::size_t answered_2xx = 0;        ///< keys whose load answer was a 2xx
  std::size_t replays_checked = 0;     ///< of those, replayed byte for byte afterwards
  std::size_t retried_to_execute = 0;  ///< keys whose load answer was 503/409, executed later
  std::size_t commits_across = 0;      ///< 2xx answers sent before the kill, answered after it
  std::size_t keys_executed = 0;       ///< keys with exactly one execution among their answers
  std::int64_t slowest_ms = 0;
  std::map<std::string, int> kinds;
};

/// After the failover: every key answered 2xx replays that answer now, byte for byte, through
/// the other instance (its record survived: 0 lost records); every other key is retried until
/// it executes. Then each key must have executed exactly once among all its answers.
FailoverOutcome check_keys(std::vector<KeyRecord>& records, const Gateway& gateway,
                           Clock::time_point killed) {
  FailoverOutcome out;
  out.keys = records.size();
  int reported = 0;
  for (auto& record : records) {
    const Timed first = record.answers.front();
    check_answer(first, out.kinds, reported, gateway);
    out.slowest_ms = std::max(out.slowest_ms, ms(first.elapsed()));
    const int other = (first.instance + 1) % kInstances;
    if (first.error.empty() && success(first.response)) {
      ++out.answered_2xx;
      if (first.start < killed && first.done > killed) ++out.commits_across;
      const Timed again = send_timed(gateway, record.request, other);
      record.answers.push_back(again);
      const bool same = again.error.empty() && replayed(again.response) &&
                        again.response.status == first.response.status &&
                        again.response.body == first.response.body;
      out.replays_checked += same;
      if (!same && reported++ < 5) {
        BOOST_TEST(same, "the retry of an answered key is not the replay of its answer; first:\n"
                             << describe(first.response) << "\nretry: " << again.error << "\n"
                             << describe(again.response) << "\n"
                             << gateway.diagnostics());
      } else if (!same) {
        BOOST_TEST(same);
      }
      continue;
    }
    // 503 or 409 at first: retried until it executes once (or replays an execution whose
    // answer its first client did not get).
    eventually(
        [&] {
          record.answers.push_back(send_timed(gateway, record.request, other));
          const Timed& retry = record.answers.back();
          return retry.answered() && success(retry.response);
        },
        kRetryInterval);
    const Timed& last = record.answers.back();
    BOOST_TEST(
        (last.error.empty() && success(last.response)),
        "a key refused during the failover never executed afterwards: " << last.error << "\n"
                                                                        << describe(last.response));
    out.retried_to_execute += last.error.empty() && executed(last.response);
  }
  for (const auto& record : records) {
    std::size_t executions = 0;
    for (const auto& a : record.answers) executions += a.error.empty() && executed(a.response);
    BOOST_TEST(executions <= 1u, "a key executed " << executions << " times");
    out.keys_executed += executions == 1;
  }
  return out;
}

std::string key_of(const HttpRequest& request) {
  for (const auto& [name, value] : request.headers)
    if (name == "Idempotency-Key") return value;
  return "";
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(PrivateStores);

// -------------------------------------------------------------------------------------------
// C43 — the primary killed under keyed load, the standby promoted

BOOST_AUTO_TEST_CASE(
    spec_C43_primary_killed_under_load_loses_no_answered_record_and_re_executes_nothing) {
  PgStandbyPair pair;
  PaymentService payments({.delay_ms = kPaymentDelayMs});
  TestUpstream upstream;
  // One request is held at the upstream across the primary's death: its commit meets the dead
  // primary and must land on the promoted one before the client is answered (C26).
  UpstreamReply held;
  held.hold = true;
  upstream.on("/held", {held});
  GatewayConfig config = failover_config(pair, payments, "load.test");
  config.upstreams.push_back({"held", {upstream.address()}});
  config.routes_yaml += route("c43-held", "load.test", "/held", "held");
  Gateway gateway(config, kInstances);
  warm_up(gateway, "load.test");
  const auto posts = payments.counter("payment_posts");

  KeyedLoad load(load_on(gateway, "load.test"));
  load.start();
  BOOST_REQUIRE_MESSAGE(load.wait_for_executions(20), "no steady load\n" << gateway.diagnostics());
  const HttpRequest held_request =
      keyed_post("/held", unique_name("c43-held"), "{\"amount\":1}", {{"Host", "load.test"}});
  auto held_answer =
      std::async(std::launch::async, [&] { return send_timed(gateway, held_request, 0); });
  BOOST_REQUIRE_MESSAGE(upstream.wait_for("/held", 1),
                        "the held request never reached the upstream\n"
                            << gateway.diagnostics());

  const auto killed = pair.kill_primary();
  upstream.release();
  // While no server takes writes, a new key gets 503 on each instance within operation_timeout
  // (C25): the load alone may meet the outage only in commits that wait for the promotion.
  std::vector<std::future<Timed>> probes;
  std::vector<HttpRequest> probe_requests;
  for (int i = 0; i < kInstances; ++i) {
    probe_requests.push_back(payment_post("load.test", unique_name("c43-outage")));
    probes.push_back(std::async(std::launch::async, [&gateway, request = probe_requests.back(), i] {
      return send_timed(gateway, request, i);
    }));
  }
  std::this_thread::sleep_for(kOutage);
  std::vector<Timed> probe_answers;
  for (auto& probe : probes) probe_answers.push_back(probe.get());
  const auto promoted = pair.promote_standby();
  // New keys from the promotion on, a client per instance: C43's 1 s is measured on them,
  // not on the load, whose clients may still be in a request that began before the promotion.
  std::vector<std::future<std::vector<KeyRecord>>> pollers;
  for (int i = 0; i < kInstances; ++i) {
    pollers.push_back(std::async(std::launch::async, [&gateway, i] {
      return poll_until_executed(gateway, i, "load.test");
    }));
  }
  std::vector<std::vector<KeyRecord>> polled;
  for (auto& poller : pollers) polled.push_back(poller.get());
  const auto executed_at_recovery = load.executions();
  load.wait_for_executions(executed_at_recovery + 10);
  load.stop();

  std::string recovery_figures;
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i) {
      const Timed& last = polled[i].back().answers.back();
      BOOST_REQUIRE_MESSAGE((last.error.empty() && executed(last.response)),
                            "no new key executed after the promotion\n"
                                << gateway.explain(last.response));
      const auto after = last.done - promoted;
      BOOST_TEST(ms(after) <= ms(kAfterPromotionBound),  // SPEC C43
                 "first new key executed " << ms(after) << " ms after the promotion\n"
                                           << gateway.diagnostics());
      recovery_figures += " instance" + std::to_string(i) +
                          "_promotion_to_first_201_ms=" + std::to_string(ms(after)) + " instance" +
                          std::to_string(i) +
                          "_keys_until_first_201=" + std::to_string(polled[i].size());
      // Checked with the load's keys: each executes once.
      for (auto& record : polled[i]) load.records().push_back(std::move(record));
    }
  }

  // The held request: executed once, answered only after its record committed on the promoted
  // standby, and replayed from there.
  const Timed held_first = held_answer.get();
  BOOST_TEST((held_first.error.empty() && executed(held_first.response)),
             held_first.error << "\n"
                              << gateway.explain(held_first.response));
  BOOST_TEST(ms(held_first.elapsed()) <= ms(kAnswerBound));  // SPEC C26, C25
  const Timed held_again = send_timed(gateway, held_request, 1);
  BOOST_TEST(
      (replayed(held_again.response) && held_again.response.body == held_first.response.body),
      gateway.explain(held_again.response));
  BOOST_TEST(upstream.count("/held") == 1u);

  std::string outage_figures;
  for (int i = 0; i < kInstances; ++i) {
    const Timed& probe = probe_answers[i];
    BOOST_TEST_CONTEXT("instance " << i << " during the outage") {
      BOOST_TEST(store_unavailable(probe.response), probe.error << "\n"
                                                                << gateway.explain(probe.response));
      BOOST_TEST(ms(probe.elapsed()) <= ms(kStoreFaultBound));  // SPEC C25
    }
    outage_figures +=
        " instance" + std::to_string(i) + "_outage_503_ms=" + std::to_string(ms(probe.elapsed()));
    // Checked with the load's keys: retried until it executes, once.
    load.records().push_back({probe_requests[i], {probe}});
  }

  const FailoverOutcome outcome = check_keys(load.records(), gateway, killed);
  const auto executions = payments.counter("payment_posts") - posts;
  const auto dups = duplicates(gateway);
  // Every key executed once in the end, and the upstream saw each once: 0 re-executions.
  BOOST_TEST(outcome.keys_executed == outcome.keys);
  BOOST_TEST(executions == outcome.keys_executed,
             "payment_posts rose by " << executions << " for " << outcome.keys_executed << " keys");
  BOOST_TEST(outcome.replays_checked == outcome.answered_2xx, "answered records lost");
  BOOST_TEST(dups == 0u);

  report("C43_primary_killed_under_load", executions, outcome.keys_executed);
  std::cout << "figures scenario=C43_primary_killed_under_load kill_to_promotion_ms="
            << ms(promoted - killed) << outage_figures << recovery_figures
            << " held_commit_answered_after_promotion_ms=" << ms(held_first.done - promoted)
            << " keys=" << outcome.keys << " answered_2xx=" << outcome.answered_2xx
            << " replays_checked=" << outcome.replays_checked
            << " commits_across_kill=" << outcome.commits_across
            << " retried_to_execute=" << outcome.retried_to_execute << " " << summary(outcome.kinds)
            << " slowest_answer_ms=" << outcome.slowest_ms << " duplicates=" << dups << std::endl;

  // The multi-host DSN everywhere, with its first host dead: a gateway started now (migrations
  // at start, then its pools) and the `keys` command reach the promoted standby.
  Gateway fresh(config, 1);
  const Timed t = send_timed(fresh, payment_post("load.test", unique_name("c43-fresh")), 0);
  BOOST_TEST((t.error.empty() && executed(t.response)), t.error << "\n"
                                                                << fresh.explain(t.response));
  BOOST_TEST(failovers(fresh, 0, "postgres").value_or(-1) == 0, "its first host is no switch");
  const auto shown = run_keys(fresh.config_path(), fresh.dir(),
                              {"show", "--route", "c43-held", key_of(held_request)});
  BOOST_TEST(shown.status == 0, shown.out + shown.err);
  BOOST_TEST((shown.out + shown.err).find("status 201") != std::string::npos,
             shown.out + shown.err);
}

// -------------------------------------------------------------------------------------------
// C46 — the switch counted and logged once per instance

BOOST_AUTO_TEST_CASE(spec_C46_each_instance_counts_and_logs_the_switch_to_the_promoted_host_once) {
  PgStandbyPair pair;
  PaymentService payments;
  Gateway gateway(failover_config(pair, payments, "c46.test"), kInstances);
  warm_up(gateway, "c46.test");
  check_no_failover(gateway, "postgres");

  const auto killed = pair.kill_primary();
  const auto promoted = pair.promote_standby();
  std::map<std::string, int> kinds;
  for (int i = 0; i < kInstances; ++i) {
    const auto polled = poll_until_executed(gateway, i, "c46.test");
    for (const auto& record : polled) ++kinds[kind_of(record.answers.front())];
    const Timed& t = polled.back().answers.front();
    BOOST_REQUIRE_MESSAGE(t.error.empty() && executed(t.response),
                          "instance " << i << " executed nothing after the failover\n"
                                      << gateway.explain(t.response));
    // More keys, so that every io thread's pool has met the new primary.
    for (int n = 0; n < 8; ++n) {
      const Timed more = send_timed(gateway, payment_post("c46.test", unique_name("c46")), i);
      ++kinds[kind_of(more)];
    }
  }

  check_one_failover(gateway, "postgres", pair.primary_address(), pair.standby_address());
  for (int i = 0; i < kInstances; ++i)
    BOOST_TEST(failovers(gateway, i, "redis").value_or(-1) == 0, "instance " << i);
  std::cout << "figures scenario=C46_pg_failover_counted_once kill_to_promotion_ms="
            << ms(promoted - killed) << " from=" << pair.primary_address()
            << " to=" << pair.standby_address() << " " << summary(kinds) << std::endl;
}
