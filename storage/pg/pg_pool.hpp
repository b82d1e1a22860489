#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gateway/core/primary_tracker.hpp"
#include "storage/pg/pg_connection.hpp"

namespace idemgate::storage::pg {

/// Up to `max_connections` PgConnections for one io thread. Connections are opened lazily, on
/// demand; an idle connection is checked (PgConnection::probe_idle) before it is handed out, and a
/// broken one, or one whose user stopped waiting mid-statement, is discarded and its slot freed,
/// so the pool reconnects by itself after a Postgres restart or failover (SPEC C25, C43). When
/// every slot is in use, acquire() waits for a returned connection until its deadline.
///
/// Reconnecting is bounded while the store fails: after a failed connect, at most one connect
/// attempt is in flight, and the next one starts only after a backoff drawn uniformly from
/// [0, b] (full jitter), b starting at Options::reconnect_backoff_first and doubling up to
/// Options::reconnect_backoff_max; a successful connect ends this and lets every caller connect
/// again. Callers that arrive meanwhile wait for the next attempt within their own deadline and
/// fail `unavailable` when it fails (or at once when it cannot start before their deadline), so
/// a dead host sees one connect per backoff from each pool, not one per request, and each
/// caller learns of the outage from at most one attempt.
///
/// Each successful connect reports the server it reached (`host:port`) to Options::tracker, so
/// a move to another host counts as a failover (SPEC C46).
///
/// @par Thread safety
/// None: one pool per io_context, used only from that io_context's thread. Leases may outlive
/// the pool (their connection is then closed on release).
class PgPool {
 public:
  struct Options {
    std::string dsn;
    std::size_t max_connections = 1;
    std::chrono::milliseconds operation_timeout{2000};  ///< deadline of each store operation
    /// Server-side `statement_timeout` sent with each connection: a safety net that ends work
    /// a timed-out client left behind. Zero: operation_timeout + 1 s.
    std::chrono::milliseconds statement_timeout{0};
    /// false: unnamed statements only and no session state (SPEC C44, PgBouncer transaction
    /// pooling); see PgConnection.
    bool prepared_statements = true;
    /// Told the server of each new connection (may be null): the process's tracker of the
    /// Postgres host in use, shared by its pools (SPEC C46).
    std::shared_ptr<core::PrimaryTracker> tracker = nullptr;
    /// Backoff bounds between connect attempts while connecting fails (see the class comment).
    /// The maximum also bounds how long the pool may wait after the store is back, e.g. after
    /// a standby's promotion (SPEC C43).
    std::chrono::milliseconds reconnect_backoff_first{25};
    std::chrono::milliseconds reconnect_backoff_max{250};
    /// Each connection's session gets `enable_seqscan = off` and `plan_cache_mode =
    /// force_generic_plan` (with prepared_statements only; see PgConnection): for a pool whose
    /// statements find rows by key, so that no prepared lookup keeps a sequential scan planned
    /// while the table was small and no batch of keys is planned again at each execution.
    bool key_plans = false;
  };

  /// A connection on loan. Destroying the lease gives the connection back, or discards it when
  /// it is broken or was left mid-operation.
  class Lease {
   public:
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();

    PgConnection& operator*() const noexcept { return *connection_; }
    PgConnection* operator->() const noexcept { return connection_.get(); }

   private:
    friend class PgPool;
    struct Shared;
    Lease(std::weak_ptr<Shared> pool, std::unique_ptr<PgConnection> connection) noexcept;

    std::weak_ptr<Shared> pool_;
    std::unique_ptr<PgConnection> connection_;
  };

  PgPool(boost::asio::any_io_executor executor, Options options);
  ~PgPool();
  PgPool(const PgPool&) = delete;
  PgPool& operator=(const PgPool&) = delete;

  /// now + operation_timeout: the deadline for one store operation started now.
  Deadline deadline() const;

  /// A connected connection, by `deadline`. Errors: `unavailable` (connect failed, or the
  /// store was failing and no connect attempt succeeded by `deadline`), `timed_out` (no
  /// connection became free, or connecting took too long).
  boost::asio::awaitable<boost::system::result<Lease>> acquire(Deadline deadline);

  /// acquire() + PgConnection::execute under one deadline (now + operation_timeout).
  boost::asio::awaitable<boost::system::result<PgResult>> execute(Statement statement,
                                                                  std::vector<Param> params);

  /// acquire() + PgConnection::query under one deadline (now + operation_timeout).
  boost::asio::awaitable<boost::system::result<PgResult>> query(std::string sql,
                                                                std::vector<Param> params);

  const Options& options() const noexcept;
  /// Connections open or being opened, on loan or idle.
  std::size_t open_connections() const noexcept;
  std::size_t idle_connections() const noexcept;
  /// Connect attempts started since the pool was made (for tests).
  std::uint64_t connect_attempts() const noexcept;

 private:
  std::shared_ptr<Lease::Shared> shared_;
};

}  // namespace idemgate::storage::pg
