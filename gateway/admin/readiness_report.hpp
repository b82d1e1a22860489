#pragma once
// One readiness report (SPEC C30, C58): whether each store answers and what each store check
// found. `/readyz` renders it as JSON, `idemgate check-config --stores` as text, and the start-up
// and reload logs one line per check.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>
#include <memory>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "gateway/core/store_check.hpp"

namespace idemgate::storage::pg {
class PgPool;
}
namespace idemgate::storage::redis {
class RedisClient;
}

namespace idemgate::admin {

struct ReadinessReport {
  /// One store and whether it answered its probe (`SELECT 1`, `PING` on every primary).
  struct Store {
    std::string name;   ///< postgres | redis
    std::string error;  ///< "" when it answered
  };
  std::vector<Store> stores;
  std::vector<core::StoreCheck> checks;  ///< empty when the checks were not run
  bool draining = false;                 ///< SIGTERM/SIGINT received (C45)
  /// A `fail_open` route forwarded a request unprotected in the last 10 s (C25, C58).
  bool degraded = false;

  /// Every store answered (C30: /readyz 200).
  bool stores_answer() const;
  bool any_check_failed() const;
  /// `ready`, `degraded` (stores answer, some request went out unprotected lately),
  /// `unavailable` (a store does not answer) or `draining`.
  std::string status() const;
  /// `{"status":…,"stores":[{"name","state","detail"}],"checks":[{"name","verdict","detail"}],
  /// "postgres":"ok"|error,"redis":"ok"|error,"failing":[…]}`; `failing` only when unavailable.
  boost::json::object to_json() const;
  /// One line per store (`postgres: ok`, `redis: failed: …`) and per check
  /// (`redis maxmemory-policy: ok: maxmemory-policy is noeviction`).
  std::string to_text() const;
};

/// The probes and checks of one process's stores, on connections of their own (never a request
/// thread's): a PgPool of one connection and a RedisClient bound to `executor`. Every call is
/// asynchronous on that executor's thread and bounded by the stores' operation_timeout; nothing
/// blocks the thread. Use from the executor's thread only; destroy before its io_context.
class StoreChecker {
 public:
  StoreChecker(boost::asio::any_io_executor executor, const config::Storage& storage,
               std::shared_ptr<core::PrimaryTracker> pg_primary = nullptr,
               std::shared_ptr<core::PrimaryTracker> redis_primary = nullptr);
  ~StoreChecker();
  StoreChecker(const StoreChecker&) = delete;
  StoreChecker& operator=(const StoreChecker&) = delete;

  /// Probes both stores and, with `with_checks`, runs the C58 checks (Redis maxmemory-policy on
  /// every primary, Postgres synchronous_commit and schema version), all concurrently.
  boost::asio::awaitable<ReadinessReport> run(bool with_checks);

 private:
  std::unique_ptr<storage::pg::PgPool> pg_;
  std::unique_ptr<storage::redis::RedisClient> redis_;
  bool allow_eviction_ = false;
};

/// `idemgate check-config --stores`: runs the report with checks on an io_context of its own
/// and prints it (to_text) to `out`. Returns 0 when every store answers and no check failed
/// (warnings allowed), 1 otherwise.
int check_stores(const config::Config& config, std::ostream& out);

}  // namespace idemgate::admin
