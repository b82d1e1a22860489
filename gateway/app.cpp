#include "gateway/app.hpp"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <limits>
#include <thread>

#include "gateway/admin/admin_server.hpp"
#include "gateway/cleaner.hpp"
#include "gateway/common/json_log.hpp"
#include "gateway/config/config_loader.hpp"
#include "gateway/core/commit_budget.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "gateway/descriptor_budget.hpp"
#include "gateway/http/server.hpp"
#include "gateway/http/upstream_pool.hpp"
#include "gateway/idempotency_handler.hpp"
#include "gateway/metrics.hpp"
#include "gateway/version.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_lock.hpp"

namespace idemgate {
namespace asio = boost::asio;
using common::log_json;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;

core::FilterEvents filter_events(Metrics& metrics) {
  core::FilterEvents events;
  events.lock_contention = [&metrics] { metrics.count_lock_contention(); };
  events.forwarded_unprotected = [&metrics] { metrics.note_unprotected(); };
  events.duplicate_execution = [&metrics] {
    metrics.count_duplicate_execution();
    log_json(spdlog::level::warn, "duplicate execution: another record had been committed first",
             {{"case", "C36"}});
  };
  events.record_commit_failed = [&metrics] {
    metrics.count_record_commit_failure();
    log_json(spdlog::level::err,
             "record commit failed after the upstream answered; the lock is kept until it expires",
             {{"case", "C26"}});
  };
  events.store_error = [&metrics](const char* what, const boost::system::error_code& ec) {
    metrics.count_store_error(what);
    log_json(spdlog::level::warn, "store error", {{"op", what}, {"error", ec.message()}});
  };
  events.task_failed = [&metrics](const char* what, const std::string& detail) {
    metrics.count_task_failure(what);
    log_json(spdlog::level::err, "background task failed and was stopped",
             {{"task", what}, {"error", detail}});
  };
  return events;
}

/// Everything one io thread owns: its Postgres pool, Redis connection, upstream pool and the
/// idempotency handler on top of them, the stores wrapped in timing decorators (metrics).
/// Created and destroyed on that thread.
class ThreadHandler final : public http::RequestHandler {
 public:
  ThreadHandler(asio::io_context& io, const config::Config& config, Metrics& metrics,
                std::shared_ptr<core::PrimaryTracker> pg_primary,
                std::shared_ptr<core::PrimaryTracker> redis_primary,
                std::shared_ptr<core::CommitBudget> commit_budget)
      : pool_(io.get_executor(), pool_options(config, std::move(pg_primary))),
        store_(pool_, io.get_executor(), storage::pg::PgRecordStore::with_group_commit()),
        timed_store_(store_, metrics),
        redis_(storage::redis::make_redis_client(io.get_executor(), config.storage.redis,
                                                 redis_primary)),
        // With wait_replicas, new locks (write + WAIT) get a connection of their own, so a WAIT
        // held up by a slow replica never delays renewals, releases and markers.
        redis_acquire_(config.storage.redis.wait_replicas > 0
                           ? storage::redis::make_redis_client(io.get_executor(),
                                                               config.storage.redis, redis_primary)
                           : nullptr),
        lock_(*redis_, {config.storage.redis.wait_replicas, config.storage.redis.operation_timeout,
                        redis_acquire_.get()}),
        timed_lock_(lock_, metrics),
        upstreams_(io.get_executor()),
        handler_(upstreams_, timed_store_, timed_lock_, filter_events(metrics),
                 std::move(commit_budget)) {}

  asio::awaitable<http::HandlerResult> handle(http::Exchange exchange) override {
    return handler_.handle(std::move(exchange));
  }
  bool holds(const config::Route& route,
             const boost::beast::http::request_header<>& header) const override {
    return handler_.holds(route, header);
  }
  http::UpstreamPool* streaming_pool() override { return &upstreams_; }
  void strip_owned_fields(boost::beast::http::fields& fields) const override {
    handler_.strip_owned_fields(fields);
  }
  void add_route_fields(const config::Route& route, std::string_view origin,
                        boost::beast::http::response_header<>& header) const override {
    handler_.add_route_fields(route, origin, header);
  }
  void when_background_done(std::function<void()> done) override {
    handler_.when_background_done(std::move(done));
  }

 private:
  static storage::pg::PgPool::Options pool_options(const config::Config& config,
                                                   std::shared_ptr<core::PrimaryTracker> tracker) {
    storage::pg::PgPool::Options options;
    options.dsn = config.storage.postgres.dsn;
    const auto threads = static_cast<std::size_t>(std::max(1, config.threads));
    const auto total = static_cast<std::size_t>(config.storage.postgres.pool_size);
    options.max_connections = std::max<std::size_t>(1, (total + threads - 1) / threads);
    options.operation_timeout = config.storage.postgres.operation_timeout;
    options.prepared_statements = config.storage.postgres.prepared_statements;
    // Requests look records up by id only (PgRecordStore): never a sequential scan, also in
    // the first minute of an empty table, before autovacuum's first ANALYZE, and one generic
    // plan per statement, a batch of ids included.
    options.key_plans = true;
    options.tracker = std::move(tracker);
    return options;
  }

  storage::pg::PgPool pool_;
  storage::pg::PgRecordStore store_;
  TimedRecordStore timed_store_;
  std::unique_ptr<storage::redis::RedisClient> redis_;
  std::unique_ptr<storage::redis::RedisClient> redis_acquire_;
  storage::redis::RedisLock lock_;
  TimedLockService timed_lock_;
  http::UpstreamPool upstreams_;
  IdempotencyHandler handler_;
};

}  // namespace

void setup_logging() {
  // Batched: an io thread never waits for stderr (json_log.hpp); the process flushes at exit.
  spdlog::set_default_logger(common::make_batched_logger("idemgate"));
}

bool run_migrations(const std::shared_ptr<const config::Config>& config) {
  // Several gateways may start together with their database: retry briefly before giving up.
  boost::system::error_code last;
  for (int attempt = 1; attempt <= 10; ++attempt) {
    auto applied = storage::pg::apply_migrations(config->storage.postgres.dsn);
    if (applied) {
      log_json(spdlog::level::info, "migrations applied", {{"applied", *applied}});
      return true;
    }
    last = applied.error();
    log_json(spdlog::level::warn, "migrations failed; retrying",
             {{"attempt", attempt}, {"error", last.message()}});
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  log_json(spdlog::level::err, "could not apply migrations", {{"error", last.message()}});
  return false;
}

int run_partition_migration(const std::shared_ptr<const config::Config>& config, int partitions) {
  using Outcome = storage::pg::PartitionReport::Outcome;
  boost::system::result<storage::pg::PartitionReport> report = core::store_errc::unavailable;
  // As run_migrations, retried while the database cannot be reached; any other failure has
  // been rolled back and would fail again.
  for (int attempt = 1; attempt <= 10; ++attempt) {
    report = storage::pg::partition_records(config->storage.postgres.dsn, partitions);
    if (report || report.error() != core::store_errc::unavailable) break;
    log_json(spdlog::level::warn, "migrations failed; retrying",
             {{"attempt", attempt}, {"error", report.error().message()}});
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!report) {
    log_json(spdlog::level::err, "could not partition idempotency_record",
             {{"error", report.error().message()}});
    return kExitRuntime;
  }
  switch (report->outcome) {
    case Outcome::converted:
      log_json(spdlog::level::info, "idempotency_record converted to hash partitions",
               {{"applied", report->migrations_applied},
                {"partitions", partitions},
                {"rows_moved", report->rows_moved}});
      return kExitOk;
    case Outcome::unchanged:
      log_json(spdlog::level::info,
               "idempotency_record is already hash-partitioned by id into " +
                   std::to_string(partitions) + " partitions; nothing to do",
               {{"applied", report->migrations_applied}, {"partitions", partitions}});
      return kExitOk;
    case Outcome::refused:
      break;
  }
  const std::string found = report->existing_key == "HASH (id)"
                                ? "hash-partitioned by id into " +
                                      std::to_string(report->existing_partitions) + " partitions"
                                : "partitioned by " + report->existing_key + " (" +
                                      std::to_string(report->existing_partitions) + " partitions)";
  log_json(spdlog::level::err,
           "idempotency_record is already " + found + "; converting it to " +
               std::to_string(partitions) +
               " hash partitions is not supported in place: the partition count is fixed once "
               "converted (run migrate with the current count, or rebuild the table by hand)",
           {{"applied", report->migrations_applied},
            {"partitions", partitions},
            {"existing_partitions", report->existing_partitions},
            {"existing_key", report->existing_key}});
  return kExitRuntime;
}

namespace {

/// One line per store that does not answer and per C58 check, at the check's level.
void log_report(const admin::ReadinessReport& report, const char* when) {
  for (const auto& store : report.stores) {
    if (store.error.empty()) continue;
    log_json(spdlog::level::warn, "store unavailable",
             {{"when", when}, {"store", store.name}, {"error", store.error}});
  }
  for (const auto& check : report.checks) {
    const auto level = check.verdict == core::StoreCheck::Verdict::failed    ? spdlog::level::err
                       : check.verdict == core::StoreCheck::Verdict::warning ? spdlog::level::warn
                                                                             : spdlog::level::info;
    log_json(level, "store check",
             {{"when", when},
              {"check", check.name},
              {"verdict", std::string(core::verdict_text(check.verdict))},
              {"detail", check.detail}});
  }
}

/// `config` with limits.max_connections resolved (SPEC C52): the soft RLIMIT_NOFILE is raised to
/// the hard one, and the limit is derived from it unless the file sets one. Logged.
std::shared_ptr<const config::Config> with_connection_limit(
    std::shared_ptr<const config::Config> config) {
  constexpr std::uint64_t kMaxConnections = 1'000'000;  // the key's own upper bound
  std::string error;
  const std::uint64_t open_files = raise_open_file_limit(error);
  if (!error.empty()) {
    log_json(spdlog::level::warn, "could not raise RLIMIT_NOFILE to its hard limit",
             {{"error", error}, {"open_files", open_files}});
  }
  const DescriptorBudget budget = descriptor_budget(*config, open_files);
  const std::uint64_t derived = std::min(budget.max_connections, kMaxConnections);
  const bool configured = config->limits.max_connections > 0;
  const std::uint64_t limit = configured ? config->limits.max_connections : derived;
  if (configured && limit > derived) {
    log_json(spdlog::level::warn,
             "limits.max_connections is above what RLIMIT_NOFILE leaves for client connections "
             "and their upstream sides: at that many connections, upstream and store "
             "connections can fail for lack of descriptors; raise the limit (ulimit -n, "
             "LimitNOFILE=) or lower max_connections",
             {{"max_connections", limit}, {"derived", derived}, {"open_files", open_files}});
  } else if (!configured && open_files <= budget.reserved + 2 * 16) {
    log_json(
        spdlog::level::warn,
        "RLIMIT_NOFILE leaves room for very few client connections: raise it (ulimit -n, "
        "LimitNOFILE=) or lower the upstreams' max_idle_connections and the pool sizes",
        {{"max_connections", limit}, {"open_files", open_files}, {"reserved", budget.reserved}});
  }
  log_json(spdlog::level::info, "connection limit",
           {{"max_connections", limit},
            {"source", configured ? "limits.max_connections" : "RLIMIT_NOFILE"},
            {"open_files", open_files},
            {"reserved", budget.reserved}});
  auto resolved = std::make_shared<config::Config>(*config);
  resolved->limits.max_connections = static_cast<std::size_t>(limit);
  return resolved;
}

}  // namespace

int run_gateway(const std::string& config_path, bool migrate) {
  setup_logging();
  std::shared_ptr<const config::Config> config;
  try {
    config = config::load_config(config_path);
  } catch (const config::ConfigError& e) {
    log_json(spdlog::level::err, "bad configuration", {{"error", e.what()}});
    return kExitConfig;
  }
  for (const auto& warning : config->warnings) {
    log_json(spdlog::level::warn, "configuration warning", {{"warning", warning}});
  }
  if (migrate && !run_migrations(config)) return kExitRuntime;
  config = with_connection_limit(std::move(config));
  // One bound for the process's commit queue, shared by every io thread (C54).
  auto commit_budget = std::make_shared<core::CommitBudget>(config->storage.postgres.max_pending);

  Metrics metrics;
  http::SessionObservers observers;
  observers.connection_opened = [&metrics] { metrics.connection_opened(); };
  observers.connection_closed = [&metrics] { metrics.connection_closed(); };
  observers.tunnel = [&metrics](bool opened) {
    if (opened) {
      metrics.tunnel_opened();
    } else {
      metrics.tunnel_closed();
    }
  };
  observers.h2_connection = [&metrics](bool opened) {
    if (opened) {
      metrics.h2_connection_opened();
    } else {
      metrics.h2_connection_closed();
    }
  };
  observers.h2_stream = [&metrics] { metrics.count_h2_stream(); };
  observers.h2_cut = [&metrics](std::string_view reason) { metrics.count_h2_cut(reason); };
  observers.request_done = [&metrics](std::string_view route, std::string_view outcome,
                                      std::chrono::microseconds upstream_time) {
    metrics.count_request(route, outcome);
    if (upstream_time.count() > 0) metrics.observe_upstream(route, upstream_time);
  };

  // One per store and process: a switch to another Redis primary or Postgres host is counted
  // and logged once, not once per thread or connection (C46).
  const auto failover_tracker = [&metrics](const char* store) {
    return std::make_shared<core::PrimaryTracker>(
        [&metrics, store](const std::string& from, const std::string& to) {
          metrics.count_store_failover(store);
          log_json(spdlog::level::warn, "store failover",
                   {{"store", store}, {"from", from}, {"to", to}});
        });
  };
  auto redis_primary = failover_tracker("redis");
  auto pg_primary = failover_tracker("postgres");

  std::unique_ptr<http::Server> server;
  std::unique_ptr<admin::AdminServer> admin_server;
  try {
    // Stores are per thread and built from the start-up configuration; a reload changes routes,
    // upstreams and limits for new requests (SPEC §1), not the store connections.
    server = std::make_unique<http::Server>(
        config,
        [config, &metrics, pg_primary, redis_primary, commit_budget](asio::io_context& io,
                                                                     unsigned) {
          return std::make_unique<ThreadHandler>(io, *config, metrics, pg_primary, redis_primary,
                                                 commit_budget);
        },
        observers);
    admin_server = std::make_unique<admin::AdminServer>(
        *config, [&metrics] { return metrics.render(); }, pg_primary, redis_primary,
        [&metrics](bool ready) { metrics.set_ready(ready); },
        [&metrics] { return metrics.unprotected_within(std::chrono::seconds(10)); });
  } catch (const std::exception& e) {
    log_json(spdlog::level::err, "cannot listen", {{"error", e.what()}});
    return kExitRuntime;
  }

  // C58: a store set up so that the contract cannot hold refuses the start.
  {
    const admin::ReadinessReport report = admin_server->check_stores_now();
    log_report(report, "start");
    if (report.any_check_failed()) {
      log_json(spdlog::level::err, "a store check failed; not starting",
               {{"report", report.to_text()}});
      return kExitRuntime;
    }
  }

  // Signals are handled on a thread of their own: stop() blocks until the io threads are done,
  // and a reload reads the file there, never on an io thread.
  asio::io_context signals_io;
  asio::signal_set signals(signals_io, SIGINT, SIGTERM, SIGHUP);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int signo) {
        if (ec) return;
        if (signo == SIGHUP) {
          try {
            auto fresh = config::load_config(config_path);
            for (const auto& warning : fresh->warnings) {
              log_json(spdlog::level::warn, "configuration warning", {{"warning", warning}});
            }
            server->update_config(std::move(fresh));
            log_json(spdlog::level::info, "configuration reloaded", {{"file", config_path}});
          } catch (const std::exception& e) {
            log_json(spdlog::level::err, "reload rejected; keeping the running configuration",
                     {{"error", e.what()}});
          }
          // C58: checked again; a failure is logged and the gateway keeps serving.
          admin_server->check_stores(
              [](admin::ReadinessReport report) { log_report(report, "reload"); });
          signals.async_wait(on_signal);
          return;
        }
        // Readiness turns 503 before the line says so: whoever reads "stopping" finds it (C45).
        admin_server->begin_drain();  // balancers stop sending new connections (C45)
        log_json(spdlog::level::info, "stopping", {{"signal", signo}});
        server->stop(true);
      };
  signals.async_wait(on_signal);
  std::thread signal_thread([&signals_io] { signals_io.run(); });

  Cleaner cleaner(*config, pg_primary);
  cleaner.start();
  metrics.set_cleanup_source([&cleaner] { return cleaner.deleted_total(); });
  metrics.set_cleaner_source([&cleaner] { return cleaner.last_run(); },
                             config->storage.cleanup.interval);
  metrics.set_overload_source([&server, &commit_budget] {
    return Metrics::OverloadReadings{server->gate().paused_seconds(), server->gate().limit(),
                                     commit_budget->pending()};
  });
  admin_server->start();

  int status = kExitOk;
  try {
    log_json(spdlog::level::info, "starting",
             {{"version", kVersion}, {"config", config_path}, {"threads", config->threads}});
    server->run();
  } catch (const std::exception& e) {
    log_json(spdlog::level::err, "gateway failed", {{"error", e.what()}});
    status = kExitRuntime;
  }
  signals_io.stop();
  signal_thread.join();
  admin_server->stop();
  metrics.set_cleanup_source(nullptr);
  metrics.set_overload_source(nullptr);
  metrics.set_cleaner_source(nullptr, config->storage.cleanup.interval);
  cleaner.stop();
  server.reset();
  admin_server.reset();
  // Every line of the run before the last one, whichever thread logged it.
  spdlog::default_logger_raw()->flush();
  log_json(spdlog::level::info, "stopped", {{"status", status}});
  spdlog::default_logger_raw()->flush();
  return status;
}

}  // namespace idemgate
