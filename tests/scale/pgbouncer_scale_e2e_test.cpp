// Connection poolers (SPEC C44): real `idemgate` and `payment-service` processes whose
// `storage.postgres.dsn` points at a PgBouncer in transaction pooling mode that this binary
// starts (tests/scale/pgbouncer.hpp) in front of a private Postgres (scripts/local-stores).
// Every scenario gets its own PgBouncer, so no server session carries state from another one.
//
// Each scenario prints lines `figures scenario=<name> …` with the measured times and the
// answers by kind.
#define BOOST_TEST_MODULE pgbouncer_scale
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <iostream>
#include <latch>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "storage/pg/migrations.hpp"
#include "tests/e2e/gateway_fixture.hpp"
#include "tests/scale/pgbouncer.hpp"
#include "tests/support/answers.hpp"
#include "tests/support/keyed_load.hpp"
#include "tests/support/local_stores.hpp"
#include "tests/support/scraping.hpp"

namespace {

using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using idemgate::test::scale::PgBouncer;

const std::string& postgres_dsn() {
  return PrivateStores::stores().pg_dsn();
}

// -------------------------------------------------------------------------------------------
// Sizes and bounds.

constexpr int kPoolerPoolSize = 4;         ///< PgBouncer default_pool_size: server connections
constexpr int kGatewayPoolSize = 4;        ///< storage.postgres.pool_size of each gateway process
constexpr int kInstances = 2;              ///< gateway processes per scenario
constexpr std::size_t kStormClients = 50;  ///< C19: N ≥ 50 identical requests
/// Distinct keys at once: far more than the server connections (kPoolerPoolSize) and than the
/// client connections of all gateways (kInstances × kGatewayPoolSize).
constexpr std::size_t kDistinctKeys = 48;
/// Distinct keys at once with named statements behind the pooler: enough to mix the sessions.
constexpr std::size_t kPreparedKeys = 32;
constexpr auto kClientTimeout = kEventDeadline;  ///< safety net on every request
constexpr auto kPoolerDown = 1s;                 ///< how long PgBouncer stays stopped at least
constexpr auto kRetryInterval = 20ms;            ///< between requests of one polling client
constexpr auto kLoadPace = 10ms;                 ///< between keys of one load thread
constexpr int kLoadThreads = 4;

HttpRequest payment_post(const std::string& host, const std::string& key,
                         const std::string& payment_id) {
  return keyed_post("/payments", key, payment_body(payment_id), {{"Host", host}});
}

/// A new key with its own payment.
HttpRequest new_payment(const std::string& host) {
  const std::string key = unique_name("c44");
  return payment_post(host, key, key);
}

/// The distinct `msg` texts of the instances' log lines that contain `needle`, with how often
/// each was logged; for `store error` lines the text is `store error <op>: <error>`.
std::map<std::string, int> logged(const Gateway& gateway, const std::string& needle) {
  std::map<std::string, int> out;
  for (int i = 0; i < gateway.instances(); ++i) {
    for (const auto& line : log_lines_containing(gateway.stderr_text(i), needle)) {
      std::string msg = field(line, "msg");
      if (msg == "store error") msg += " " + field(line, "op") + ": " + field(line, "error");
      ++out[msg];
    }
  }
  return out;
}

// -------------------------------------------------------------------------------------------
// Configuration.

/// `name` matched by Host `host` on POST /payments, keys required, fail_closed.
std::string route(const std::string& name, const std::string& host,
                  const std::string& idempotency_extra = "") {
  return "  - name: " + name + "\n    match: { host: " + host +
         ", path_prefix: /payments, methods: [POST] }\n    upstream: payments\n"
         "    idempotency: { mode: required, methods: [POST], lock_ttl: 30s, "
         "on_store_error: fail_closed" +
         idempotency_extra + " }\n";
}

/// A gateway whose Postgres is `bouncer`, with `prepared_statements` as given, in front of
/// `payments`; routes from `routes_yaml`.
GatewayConfig pooled_config(const PgBouncer& bouncer, bool prepared_statements,
                            const PaymentService& payments, std::string routes_yaml) {
  GatewayConfig config;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml = std::move(routes_yaml);
  config.postgres_dsn = bouncer.dsn();
  config.postgres_pool_size = kGatewayPoolSize;
  config.prepared_statements = prepared_statements;
  // Generous: a store operation that merely runs late on the shared machine is not what these
  // scenarios are about (a late lock reply leaves a 409 for the key until lock_ttl).
  config.redis_operation_timeout = "2s";
  config.postgres_operation_timeout = "5s";
  return config;
}

/// Runs `n` transactions through `bouncer` at once (each a 300 ms `pg_sleep`), so that PgBouncer
/// opens server connections, up to its pool size, and keeps them in its pool. Returns how many
/// distinct server sessions (backend pids) ran them.
std::size_t open_server_connections(const PgBouncer& bouncer, int n) {
  std::latch together(n);
  std::vector<std::string> pids(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      try {
        Database db(bouncer.dsn());
        together.arrive_and_wait();
        pids[i] = db.scalar("SELECT pg_backend_pid() FROM pg_sleep(0.3)");
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& c : clients) c.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error("through PgBouncer: " + e);
  return std::set<std::string>(pids.begin(), pids.end()).size();
}

// -------------------------------------------------------------------------------------------
// Steady keyed load: each thread sends new keys to its instance and retries every answered key
// once through the other instance.

KeyedLoad::Options load_on(const Gateway& gateway, const std::string& host) {
  auto options = KeyedLoad::on(gateway, [host] { return new_payment(host); });
  options.threads = kLoadThreads;
  options.retry_elsewhere = true;
  options.pace = kLoadPace;
  return options;
}

/// What check_answers() asserts here beyond an allowed kind: every 2xx answer of a key after its
/// first is a replay of it, byte for byte (C16, never another execution's answer).
const AnswerChecks kLaterAnswersReplay{.later_successes_replay_the_first = true};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(PrivateStores);

// -------------------------------------------------------------------------------------------
// The pooler itself

BOOST_AUTO_TEST_CASE(pgbouncer_pools_transactions_and_restarts_on_its_port) {
  PgBouncer bouncer(postgres_dsn(), {});
  std::cout << "figures scenario=pgbouncer version=\"" << bouncer.version() << "\"" << std::endl;
  BOOST_TEST(open_server_connections(bouncer, kPoolerPoolSize + 2) == std::size_t{kPoolerPoolSize},
             "PgBouncer's server connections are not default_pool_size\n"
                 << bouncer.log_tail());
  {
    Database db(bouncer.dsn());
    BOOST_TEST(db.scalar("SELECT current_database()") == "idem");
  }
  bouncer.stop();
  BOOST_TEST(!bouncer.running());
  BOOST_CHECK_THROW(Database{bouncer.dsn()}, std::runtime_error);
  bouncer.start();
  Database db(bouncer.dsn());
  BOOST_TEST(db.scalar("SELECT 1") == "1", bouncer.log_tail());
}

// -------------------------------------------------------------------------------------------
// C44 with C15–C19: one execution per key through transaction pooling

BOOST_AUTO_TEST_CASE(spec_C44_storm_through_pgbouncer_executes_once_and_replays) {
  PgBouncer bouncer(postgres_dsn(), {});
  PaymentService payments({.delay_ms = 200});
  // As C19 spells it: the same processes serve both concurrency modes, told apart by Host.
  Gateway gateway(pooled_config(bouncer, false, payments,
                                route("c44_reject", "reject.test", ", concurrency: reject") +
                                    route("c44_wait", "wait.test",
                                          ", concurrency: wait, wait_timeout: 20s, "
                                          "max_waiters: 200")),
                  kInstances);
  std::string figures;

  for (const std::string mode : {"reject", "wait"}) {
    BOOST_TEST_CONTEXT("concurrency: " << mode) {
      const auto posts = payments.counter("payment_posts");
      const auto inserted = payments.counter("payments_inserted");
      const std::string key = unique_name("c44-storm-" + mode);
      const HttpRequest request = payment_post(mode + ".test", key, key);
      const auto started = Clock::now();
      const auto results = run_concurrently(kStormClients, [&](std::size_t i) {
        return http_request(kLoopback, gateway.port(static_cast<int>(i % kInstances)), request,
                            kClientTimeout);
      });
      const auto storm_ms = ms(Clock::now() - started);
      std::vector<const HttpResponse*> executions;
      std::vector<const HttpResponse*> replays;
      std::size_t conflicts = 0;
      for (const auto& r : results) {
        if (!r.error.empty()) {
          BOOST_TEST(false, "no answer: " << r.error);
        } else if (executed(r.response)) {
          executions.push_back(&r.response);
        } else if (success(r.response) && replayed(r.response)) {
          replays.push_back(&r.response);
        } else if (in_flight(r.response)) {
          ++conflicts;
        } else {
          BOOST_TEST(false, "unexpected answer:\n" << gateway.explain(r.response));
        }
      }
      BOOST_TEST_REQUIRE(executions.size() == 1u, gateway.diagnostics());
      for (const auto* r : replays) BOOST_TEST(r->body == executions.front()->body);
      if (mode == "wait") BOOST_TEST(replays.size() == kStormClients - 1);
      if (mode == "reject") BOOST_TEST(replays.size() + conflicts == kStormClients - 1);
      BOOST_TEST(payments.counter("payment_posts") == posts + 1);
      BOOST_TEST(payments.counter("payments_inserted") == inserted + 1);

      // Later retries, through either instance, get the stored answer.
      for (int i = 0; i < kInstances; ++i) {
        const Timed again = send_timed(gateway, request, i);
        BOOST_TEST((again.error.empty() && replayed(again.response) &&
                    again.response.body == executions.front()->body),
                   again.error << "\n"
                               << gateway.explain(again.response));
      }
      BOOST_TEST(payments.counter("payment_posts") == posts + 1);
      figures += " " + mode + "_storm_ms=" + std::to_string(storm_ms) + " " + mode +
                 "_replayed=" + std::to_string(replays.size()) + " " + mode +
                 "_409=" + std::to_string(conflicts);
    }
  }

  // Many keys at once: each executes once, however the statements are spread over the
  // server connections.
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");
  std::vector<HttpRequest> requests;
  for (std::size_t i = 0; i < kDistinctKeys; ++i) requests.push_back(new_payment("reject.test"));
  auto started = Clock::now();
  const auto first = run_concurrently(kDistinctKeys, [&](std::size_t i) {
    return http_request(kLoopback, gateway.port(static_cast<int>(i % kInstances)), requests[i],
                        kClientTimeout);
  });
  const auto distinct_ms = ms(Clock::now() - started);
  started = Clock::now();
  const auto again = run_concurrently(kDistinctKeys, [&](std::size_t i) {
    return http_request(kLoopback, gateway.port(static_cast<int>((i + 1) % kInstances)),
                        requests[i], kClientTimeout);
  });
  const auto replay_ms = ms(Clock::now() - started);
  int reported = 0;
  for (std::size_t i = 0; i < kDistinctKeys; ++i) {
    const bool ok = first[i].error.empty() && executed(first[i].response) &&
                    again[i].error.empty() && replayed(again[i].response) &&
                    again[i].response.body == first[i].response.body;
    if (!ok && reported++ < 5)
      BOOST_TEST(ok, "key " << i << ": first " << first[i].error << "\n"
                            << describe(first[i].response) << "\nretry " << again[i].error << "\n"
                            << describe(again[i].response));
  }
  BOOST_TEST(reported == 0,
             reported << " of " << kDistinctKeys << " keys failed" << gateway.diagnostics());
  BOOST_TEST(payments.counter("payment_posts") - posts == kDistinctKeys);
  BOOST_TEST(payments.counter("payments_inserted") - inserted == kDistinctKeys);
  BOOST_TEST(duplicates(gateway) == 0u);

  Database direct(postgres_dsn());
  const std::string sessions = direct.scalar(
      "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
      "AND backend_type = 'client backend' AND pid <> pg_backend_pid()");
  std::cout << "figures scenario=C44_storm_through_pgbouncer" << figures
            << " distinct_keys=" << kDistinctKeys << " distinct_ms=" << distinct_ms
            << " distinct_replay_ms=" << replay_ms << " gateway_processes=" << kInstances
            << " gateway_pool_size=" << kGatewayPoolSize
            << " pooler_default_pool_size=" << kPoolerPoolSize << " postgres_sessions=" << sessions
            << std::endl;
}

// -------------------------------------------------------------------------------------------
// C44: the default (named statements) behind transaction pooling

BOOST_AUTO_TEST_CASE(
    spec_C44_prepared_statements_true_behind_transaction_pooling_fails_as_documented) {
  // Round robin makes the first failure certain: a statement is prepared on one server session
  // and executed on the next, as concurrent clients make happen with the default order too.
  PgBouncer bouncer(postgres_dsn(), {.server_round_robin = true});
  BOOST_TEST_REQUIRE(
      open_server_connections(bouncer, kPoolerPoolSize) == std::size_t{kPoolerPoolSize},
      bouncer.log_tail());
  PaymentService payments;
  // A short commit_timeout: commits that keep failing give up (C26) within the test's time.
  // One process is enough: its own reconnects meet the statements it left on every session.
  Gateway gateway(pooled_config(bouncer, true, payments,
                                route("c44_prepared", "prepared.test", ", commit_timeout: 1s")),
                  1);
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");

  // The first keyed request of a fresh gateway: its lookup's named statement is missing on the
  // server session that runs it, a store error.
  std::vector<KeyRecord> records;
  records.push_back({new_payment("prepared.test"), {}});
  records.back().answers.push_back(send_timed(gateway, records.back().request, 0));
  const Timed first = records.back().answers.back();
  BOOST_TEST(store_unavailable(first.response), first.error << "\n"
                                                            << gateway.explain(first.response));

  // Load: distinct keys at once, then each key again.
  std::vector<HttpRequest> requests;
  for (std::size_t i = 0; i < kPreparedKeys; ++i) requests.push_back(new_payment("prepared.test"));
  for (int round = 0; round < 2; ++round) {
    const auto results = run_concurrently(kPreparedKeys, [&](std::size_t i) {
      return http_request(kLoopback, gateway.port(), requests[i], kClientTimeout);
    });
    for (std::size_t i = 0; i < kPreparedKeys; ++i) {
      if (round == 0) records.push_back({requests[i], {}});
      Timed t;
      t.response = results[i].response;
      t.error = results[i].error;
      records[i + 1].answers.push_back(std::move(t));
    }
  }
  const LoadTally tally = check_answers(records, gateway, kLaterAnswersReplay);
  const auto executions = payments.counter("payment_posts") - posts;
  const auto payments_made = payments.counter("payments_inserted") - inserted;
  BOOST_TEST(tally.kinds.contains("503"), summary(tally.kinds));
  // Never a second execution of a key: the payment service inserts each payment once, so a
  // repeated execution is a POST without an insert.
  BOOST_TEST(executions == payments_made, "a key executed twice");
  BOOST_TEST(payments_made == tally.keys_answered_2xx);
  BOOST_TEST(duplicates(gateway) == 0u);

  // What the log says, for the documentation.
  const auto errors = logged(gateway, "prepared statement");
  BOOST_TEST(!errors.empty(), "no prepared-statement error logged\n" << gateway.diagnostics());
  BOOST_TEST(errors.begin()->first.starts_with("postgres: "), errors.begin()->first);
  std::cout
      << "figures scenario=C44_prepared_statements_true_behind_transaction_pooling pgbouncer=\""
      << bouncer.version() << "\" keys=" << records.size() << " " << summary(tally.kinds)
      << " executions=" << executions << " first_answer=" << first.response.status
      << " first_answer_body=" << first.response.body << std::endl;
  for (const auto& [text, n] : errors)
    std::cout << "figures scenario=C44_prepared_statements_true_behind_transaction_pooling count="
              << n << " logged=" << text << std::endl;
  for (const auto& [text, n] : logged(gateway, "record commit failed"))
    std::cout << "figures scenario=C44_prepared_statements_true_behind_transaction_pooling count="
              << n << " logged=" << text << std::endl;
  for (const auto& [text, n] : logged(gateway, "store error"))
    std::cout << "figures scenario=C44_prepared_statements_true_behind_transaction_pooling count="
              << n << " logged=" << text << std::endl;
}

// -------------------------------------------------------------------------------------------
// C44 with C25: a PgBouncer restart is a store error the gateway recovers from

BOOST_AUTO_TEST_CASE(
    spec_C44_pgbouncer_restart_under_load_is_a_store_error_the_gateway_recovers_from) {
  PgBouncer bouncer(postgres_dsn(), {});
  PaymentService payments;
  Gateway gateway(pooled_config(bouncer, false, payments, route("c44_restart", "restart.test")),
                  kInstances);
  const auto posts = payments.counter("payment_posts");
  const auto inserted = payments.counter("payments_inserted");

  KeyedLoad load(load_on(gateway, "restart.test"));
  load.start();
  BOOST_REQUIRE_MESSAGE(load.wait_for_executions(10), "no steady load\n" << gateway.diagnostics());
  const auto stopping = Clock::now();
  bouncer.stop();
  const auto stopped = Clock::now();
  // While PgBouncer is down the stores do not answer: not ready (C30).
  std::vector<unsigned> ready_during;
  for (int i = 0; i < kInstances; ++i)
    ready_during.push_back(gateway.admin_get("/readyz", i).status);
  // Down for kPoolerDown, and until the load met the outage (a 503), which the checks below
  // count on.
  std::this_thread::sleep_for(kPoolerDown);
  eventually([&] { return load.answers_of_kind("503", stopped) > 0; }, kRetryInterval);
  bouncer.start();
  const auto restarted = Clock::now();

  // C44 via C25: the gateway reconnects by itself once PgBouncer is back. SPEC states no time
  // for that: the recovery is awaited as an event (kEventDeadline only guards against a hang)
  // and its time printed.
  const auto recovered = load.wait_for_recovery(restarted);
  std::this_thread::sleep_for(500ms);  // some load after the recovery too
  load.stop();

  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i) {
      BOOST_TEST(ready_during[i] == 503u, "ready while PgBouncer was down");
      const HttpResponse ready = gateway.admin_get("/readyz", i);
      BOOST_TEST(ready.status == 200u, describe(ready));
    }
  }
  std::string recovery_figures;
  for (int i = 0; i < kInstances; ++i) {
    BOOST_TEST_CONTEXT("instance " << i) {
      BOOST_REQUIRE_MESSAGE(recovered[i].has_value(),
                            "no keyed request executed after the restart\n"
                                << gateway.diagnostics() << bouncer.log_tail());
      const auto after = *recovered[i] - restarted;
      recovery_figures += " instance" + std::to_string(i) +
                          "_first_success_after_restart_ms=" + std::to_string(ms(after));
    }
  }

  // Answers sent while PgBouncer was down: 503 or (those that got through before) success.
  std::map<std::string, int> while_down;
  for (const auto& record : load.records())
    for (const auto& a : record.answers)
      if (a.start >= stopped && a.done < restarted) ++while_down[kind_of(a)];
  BOOST_TEST(while_down["503"] >= 1,
             "no request met the stopped PgBouncer: " << summary(while_down));
  const LoadTally tally = check_answers(load.records(), gateway, kLaterAnswersReplay);
  const std::size_t replays_checked = check_replays(load.records(), gateway);
  const auto executions = payments.counter("payment_posts") - posts;
  const auto payments_made = payments.counter("payments_inserted") - inserted;
  BOOST_TEST(executions == payments_made, "a key executed twice");
  BOOST_TEST(payments_made == tally.keys_answered_2xx, "a key executed without a 2xx answer");
  BOOST_TEST(duplicates(gateway) == 0u);
  std::cout << "figures scenario=C44_pgbouncer_restart_under_load stop_ms="
            << ms(stopped - stopping) << " down_ms=" << ms(restarted - stopped) << recovery_figures
            << " keys=" << load.records().size() << " " << summary(tally.kinds)
            << " while_down: " << summary(while_down) << " slowest_answer_ms=" << tally.slowest_ms
            << " replays_checked=" << replays_checked << " executions=" << executions << std::endl;
}

// -------------------------------------------------------------------------------------------
// C44: no session state, start-up included

BOOST_AUTO_TEST_CASE(spec_C44_gateway_start_through_pgbouncer_leaves_no_advisory_lock_behind) {
  // Round robin: each statement of the start-up runs on another server session, as under load.
  // A lock left on a pooled server session would block the migrations of every later start.
  // The schema is brought up to date first, directly, so that the start-up runs the same
  // statements whichever scenario ran before.
  const auto migrated = idemgate::storage::pg::apply_migrations(postgres_dsn());
  BOOST_TEST_REQUIRE(migrated.has_value(), migrated.error().message());
  PgBouncer bouncer(postgres_dsn(), {.server_round_robin = true});
  BOOST_TEST_REQUIRE(
      open_server_connections(bouncer, kPoolerPoolSize) == std::size_t{kPoolerPoolSize},
      bouncer.log_tail());
  PaymentService payments;
  Gateway gateway(pooled_config(bouncer, false, payments, route("c44_start", "start.test")), 1);
  Database direct(postgres_dsn());
  BOOST_TEST(direct.scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == "0",
             "a server session kept the gateway's advisory lock\n"
                 << gateway.diagnostics());
  const Timed t = send_timed(gateway, new_payment("start.test"), 0);
  BOOST_TEST(executed(t.response), t.error << "\n" << gateway.explain(t.response));
}
