#pragma once

#include <libpq-fe.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "gateway/core/errors.hpp"
#include "storage/pg/pg_result.hpp"

namespace idemgate::storage::pg {

/// The point in time by which an operation must have ended.
using Deadline = std::chrono::steady_clock::time_point;

/// One statement parameter. `bytes` values go in binary format (bytea: any bytes, `\0`
/// included); `text` values are parsed by the server into the parameter's type, which is how
/// numbers and booleans are sent (`Param::text(std::to_string(n))`).
struct Param {
  std::optional<std::string> value;  ///< std::nullopt: SQL NULL
  bool binary = false;

  static Param bytes(std::string v) { return {std::move(v), true}; }
  static Param text(std::string v) { return {std::move(v), false}; }
  static Param null() { return {}; }
};

/// A named statement, prepared on a connection the first time it runs there and reused by name
/// afterwards. Both strings must outlive every connection that ran it (use string literals);
/// one name always means one SQL text.
struct Statement {
  const char* name;
  const char* sql;
};

/// One libpq connection driven asynchronously on an Asio executor: a duplicate of libpq's socket
/// is wrapped in a `posix::stream_descriptor` and only ever waited on (libpq closes its own
/// descriptor when it finds the connection lost, so Asio never registers that one); libpq does
/// all reads and writes (non-blocking). Results come back in binary format.
///
/// Every operation takes a deadline and ends by it. Errors are `core::store_errc` values:
/// - `unavailable`: cannot connect, or the connection was lost (server restart,
///   `pg_terminate_backend`, SQLSTATE classes 08 and 57P), or a write refused as read-only
///   (SQLSTATE 25006: the host is a standby now, SPEC C43);
/// - `timed_out`: the deadline passed (or the server cancelled the statement, SQLSTATE 57014);
/// - `conflict`: SQLSTATE 23505 (unique violation);
/// - `protocol`: any other statement error or an unexpected answer.
/// After `unavailable`, `protocol` on the wire level, or a client-side timeout, broken() is true
/// and the connection must be discarded: it is never reused mid-statement. Plain SQL errors
/// (`conflict`, `protocol` from the server) leave it usable. The message of the last error is
/// kept in last_error() and logged.
///
/// A client-side timeout does not stop the server: a statement the client gave up on may still
/// complete and commit (its outcome is unknown to the caller). connect() therefore sets the
/// server's `statement_timeout`, so abandoned work ends soon after. Host names in the DSN are
/// resolved by libpq, blocking: use numeric addresses (or `hostaddr`) on io threads. libpq notices
/// go to spdlog.
///
/// @par Thread safety
/// None: use from one thread (the executor's io thread), one operation at a time.
class PgConnection {
 public:
  /// `prepared_statements` false (SPEC C44, for PgBouncer's transaction pooling): execute() runs
  /// every Statement unnamed (PQsendQueryParams) and connect() sets no session state (no
  /// server-side statement_timeout then: the pooler's or the role's applies).
  ///
  /// `key_plans` (with prepared statements only): connect() also sets the session's
  /// `enable_seqscan` off and `plan_cache_mode` to `force_generic_plan` (Postgres 12 or later).
  /// For sessions whose statements find rows by key alone: the generic plan of a prepared lookup
  /// made while its table is small is a sequential scan, and Postgres keeps it while the table
  /// grows, until the next ANALYZE; and a statement taking an array of keys (a batch) is
  /// otherwise planned again at every execution, since the planner prices its custom plan for a
  /// short array below the generic one.
  PgConnection(boost::asio::any_io_executor executor, std::string dsn,
               std::chrono::milliseconds statement_timeout, bool prepared_statements = true,
               bool key_plans = false);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  /// Opens the connection (PQconnectStartParams + PQconnectPoll). Call once.
  boost::asio::awaitable<boost::system::result<void>> connect(Deadline deadline);

  /// Runs a prepared statement (prepared first on this connection if needed).
  boost::asio::awaitable<boost::system::result<PgResult>> execute(Statement statement,
                                                                  std::vector<Param> params,
                                                                  Deadline deadline);

  /// Runs one unprepared statement (PQsendQueryParams; one SQL command, `$n` parameters).
  boost::asio::awaitable<boost::system::result<PgResult>> query(std::string sql,
                                                                std::vector<Param> params,
                                                                Deadline deadline);

  /// Non-blocking check, for a pool about to hand out an idle connection, that the server has
  /// not closed it meanwhile (restart, `pg_terminate_backend`) and that it is not inside a
  /// transaction. false: the connection is broken.
  bool probe_idle();

  bool connected() const noexcept { return connected_; }
  /// True once the connection must not be used again (see the class comment).
  bool broken() const noexcept { return broken_; }
  /// Marks the connection broken, so that the pool drops it instead of lending it again: for a
  /// caller about to retry a failed write, which must reach whichever server is primary now
  /// (SPEC C26; the error may come from a server that has become a standby, SQLSTATE 25006).
  void discard() noexcept { broken_ = true; }
  /// True while an operation runs; stays true if its caller stopped waiting mid-operation.
  bool busy() const noexcept { return busy_; }
  /// The server process id of this connection (0 when not connected).
  int backend_pid() const noexcept;
  /// `host:port` of the server this connection reached (PQhost, PQport: with a multi-host DSN,
  /// the host libpq settled on, SPEC C43), brackets around an IPv6 address; "" when not
  /// connected.
  std::string server_address() const;
  const std::string& last_error() const noexcept { return last_error_; }

 private:
  boost::asio::awaitable<boost::system::result<void>> open();
  boost::asio::awaitable<boost::system::result<PgResult>> run_prepared(Statement statement,
                                                                       std::vector<Param> params);
  boost::asio::awaitable<boost::system::result<PgResult>> run_unprepared(std::string sql,
                                                                         std::vector<Param> params);
  boost::asio::awaitable<boost::system::result<PgResult>> finish_command();
  template <class T>
  boost::asio::awaitable<boost::system::result<T>> within(
      boost::asio::awaitable<boost::system::result<T>> operation, Deadline deadline,
      const char* what, const char* name);
  void arm_deadline(Deadline deadline);
  void disarm_deadline() noexcept;
  bool attach_socket();
  boost::system::error_code lost(const char* what);
  boost::system::error_code wait_failed(boost::system::error_code ec);
  void close() noexcept;

  std::string dsn_;
  std::chrono::milliseconds statement_timeout_;
  bool prepared_statements_ = true;
  bool key_plans_ = false;
  boost::asio::steady_timer timer_;
  PGconn* conn_ = nullptr;
  std::optional<boost::asio::posix::stream_descriptor> socket_;
  std::unordered_set<std::string> prepared_;
  std::string last_error_;
  bool connected_ = false;
  bool broken_ = false;
  bool busy_ = false;
  /// The statement deadline's state (arm_deadline): which statement a timer expiry belongs to,
  /// whether it expired, and a token that expires with this object.
  std::uint64_t deadline_generation_ = 0;
  bool deadline_passed_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace idemgate::storage::pg
