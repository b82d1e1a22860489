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

#include "gateway/config/config.hpp"

namespace idemgate::core {
class PrimaryTracker;
}
namespace idemgate::storage::pg {
class PgPool;
}
namespace idemgate::storage::redis {
class RedisClient;
}

namespace idemgate::admin {

/// Answers, over HTTP/1.1 with keep-alive:
/// - `GET /healthz` → 200 `{"status":"ok"}` while the process runs (C30).
/// - `GET /readyz` → 200 `{"status":"ready",…}` when Postgres answers `SELECT 1` and every Redis
///   primary in use answers `PING` (under Sentinel: a primary was found and is one; in a
///   cluster: every slot owner), each within its configured `operation_timeout`; otherwise 503
///   `{"status":"unavailable","failing":["postgres"|"redis",…],"postgres":"…","redis":"…"}`
///   with the error of each failing store (C30); 503 `{"status":"draining"}` without probing
///   once begin_drain() was called (C45: a balancer stops sending new connections while the
///   requests in flight finish). The probes use a dedicated PgPool of one
///   connection and a dedicated RedisClient, run concurrently on the admin thread, and
///   reconnect by themselves when a store returns.
/// - `GET /metrics` → 200 Prometheus text (version 0.0.4) from `metrics_text` (C31), after a
///   readiness check as for `/readyz` (so `idemgate_ready` is fresh at every scrape; a scrape
///   takes up to the larger store `operation_timeout` longer while a store hangs).
/// - other paths → 404, other methods → 405 (HEAD is answered like GET without a body).
///
/// @par Thread safety
/// Construct, start() and stop() from one controlling thread; port() anywhere.
/// `metrics_text` and `on_ready` are called on the admin thread.
class AdminServer {
 public:
  using MetricsText = std::function<std::string()>;
  /// Told the result of every readiness check (true: ready), before its answer is written.
  using ReadyObserver = std::function<void(bool)>;

  /// Binds `config.admin` (port 0: the OS chooses). Throws boost::system::system_error when
  /// binding fails. Store settings are taken from `config.storage` (a reload does not change
  /// them, nor the admin address). `pg_primary` and `redis_primary` (may be null) are the
  /// process's trackers of the Postgres host and the Redis primary in use (SPEC C46).
  /// `on_ready` (may be empty) feeds `idemgate_ready`.
  AdminServer(const config::Config& config, MetricsText metrics_text,
              std::shared_ptr<core::PrimaryTracker> pg_primary = nullptr,
              std::shared_ptr<core::PrimaryTracker> redis_primary = nullptr,
              ReadyObserver on_ready = {});
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

 private:
  boost::asio::io_context io_{1};
  boost::asio::ip::tcp::acceptor acceptor_;
  std::unique_ptr<storage::pg::PgPool> pg_;
  std::unique_ptr<storage::redis::RedisClient> redis_;
  MetricsText metrics_text_;
  ReadyObserver on_ready_;
  std::atomic<bool> draining_{false};
  std::string address_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace idemgate::admin
