#pragma once
// The admin listener (SPEC C30, C31): `/healthz`, `/readyz` and `/metrics` on `admin`, served by
// a small Beast server on a thread and io_context of its own, so that a scrape or a probe never
// competes with request threads, and a busy request thread never delays a probe.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "gateway/admin/readiness_report.hpp"
#include "gateway/config/config.hpp"

namespace idemgate::admin {

/// Answers, over HTTP/1.1 with keep-alive:
/// - `GET /healthz` → 200 `{"status":"ok"}` while the process runs (C30).
/// - `GET /readyz` → 200 when Postgres answers `SELECT 1` and every Redis primary in use answers
///   `PING` (under Sentinel: a primary was found and is one; in a cluster: every slot owner),
///   each within its configured `operation_timeout`, otherwise 503 (C30); the body is the
///   ReadinessReport as JSON: `status` (`ready`, `degraded` while `degraded` says a fail_open
///   route forwarded unprotected lately, or `unavailable`), each store's state, each C58 check
///   with its verdict, and, when unavailable, `failing` (C58); 503 `{"status":"draining"}` without
///   probing once begin_drain() was called (C45: a balancer stops sending new connections while the
///   requests in flight finish). The probes use a dedicated PgPool of one
///   connection and a dedicated RedisClient, run concurrently on the admin thread, and
///   reconnect by themselves when a store returns.
/// - `GET /metrics` → 200 Prometheus text (version 0.0.4) from `metrics_text` (C31), after a
///   readiness check as for `/readyz` (so `idemgate_ready` is fresh at every scrape; a scrape
///   takes up to the larger store `operation_timeout` longer while a store hangs).
/// - other paths → 404, other methods → 405 (HEAD is answered like GET without a body).
///
/// At most 16 connections are open at once; more wait in the listen backlog. An accept error
/// (EMFILE) pauses the listener with a backoff of 50 ms doubling to 1 s; pauses are logged at
/// most once a second (`accept paused`, `listener: admin`, SPEC C52).
///
/// @par Thread safety
/// Construct, start() and stop() from one controlling thread; port() anywhere.
/// `metrics_text` and `on_ready` are called on the admin thread.
class AdminServer {
 public:
  using MetricsText = std::function<std::string()>;
  /// Told the result of every readiness check (true: ready), before its answer is written.
  using ReadyObserver = std::function<void(bool)>;
  /// True while requests on a fail_open route are being forwarded unprotected (one in the last
  /// 10 s): /readyz says `degraded` (C58). Called on the admin thread.
  using DegradedSource = std::function<bool()>;

  /// Binds `config.admin` (port 0: the OS chooses). Throws boost::system::system_error when
  /// binding fails. Store settings are taken from `config.storage` (a reload does not change
  /// them, nor the admin address). `pg_primary` and `redis_primary` (may be null) are the
  /// process's trackers of the Postgres host and the Redis primary in use (SPEC C46).
  /// `on_ready` (may be empty) feeds `idemgate_ready`.
  AdminServer(const config::Config& config, MetricsText metrics_text,
              std::shared_ptr<core::PrimaryTracker> pg_primary = nullptr,
              std::shared_ptr<core::PrimaryTracker> redis_primary = nullptr,
              ReadyObserver on_ready = {}, DegradedSource degraded = {});
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  /// Starts the admin thread; logs `{"msg":"admin listening","port":N}`.
  void start();
  /// Stops serving and joins the thread; idempotent.
  void stop();
  /// From now on `/readyz` answers 503 "draining" until the process exits (SPEC C45). Any
  /// thread.
  void begin_drain() noexcept { draining_.store(true, std::memory_order_relaxed); }

  /// The bound port.
  std::uint16_t port() const { return port_; }

  /// Runs the store probes and C58 checks before start(), on this server's own io_context from
  /// the calling thread (the connections stay for /readyz), and returns the report.
  ReadinessReport check_stores_now();
  /// After start(): runs the checks on the admin thread and calls `done` there with the report
  /// (SIGHUP). Any thread.
  void check_stores(std::function<void(ReadinessReport)> done);

 private:
  boost::asio::io_context io_{1};
  boost::asio::ip::tcp::acceptor acceptor_;
  std::unique_ptr<StoreChecker> checker_;
  MetricsText metrics_text_;
  ReadyObserver on_ready_;
  DegradedSource degraded_;
  std::atomic<bool> draining_{false};
  std::string address_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace idemgate::admin
