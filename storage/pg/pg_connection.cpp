#include "storage/pg/pg_connection.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <climits>
#include <string_view>
#include <variant>

#include "gateway/common/use_nothrow.hpp"

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using core::store_errc;

using common::use_nothrow;

std::string_view trimmed(const char* message) {
  std::string_view text = message ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text;
}

// libpq prints notices to stderr unless told otherwise; every line on stderr must come from the
// logger (SPEC C32).
void forward_notice(void*, const char* message) {
  spdlog::info("postgres: {}", trimmed(message));
}

// The parallel arrays PQsendQuery{Prepared,Params} take, pointing into `params`.
struct WireParams {
  explicit WireParams(const std::vector<Param>& params) {
    for (const auto& p : params) {
      values.push_back(p.value ? p.value->c_str() : nullptr);
      lengths.push_back(p.value ? static_cast<int>(p.value->size()) : 0);
      formats.push_back(p.binary ? 1 : 0);
    }
  }
  static bool fits(const std::vector<Param>& params) {
    for (const auto& p : params) {
      if (p.value && p.value->size() > static_cast<std::size_t>(INT_MAX)) return false;
    }
    return params.size() <= 65535;
  }
  int count() const { return static_cast<int>(values.size()); }

  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;
};

constexpr int kBinaryResults = 1;

}  // namespace

PgConnection::PgConnection(asio::any_io_executor executor, std::string dsn,
                           std::chrono::milliseconds statement_timeout, bool prepared_statements,
                           bool key_plans)
    : dsn_(std::move(dsn)),
      statement_timeout_(statement_timeout),
      prepared_statements_(prepared_statements),
      key_plans_(key_plans),
      timer_(std::move(executor)) {}

PgConnection::~PgConnection() {
  close();
}

void PgConnection::close() noexcept {
  // Asio waits on a duplicate of libpq's socket (attach_socket): closing it deregisters a
  // descriptor only this object owns; PQfinish then closes libpq's own.
  socket_.reset();
  if (conn_) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  connected_ = false;
}

int PgConnection::backend_pid() const noexcept {
  return conn_ ? PQbackendPID(conn_) : 0;
}

std::string PgConnection::server_address() const {
  if (!conn_ || !connected_) return {};
  const char* host = PQhost(conn_);
  const char* port = PQport(conn_);
  std::string text = host ? host : "";
  if (text.find(':') != std::string::npos) text = "[" + text + "]";
  return text + ":" + (port ? port : "");
}

boost::system::error_code PgConnection::lost(const char* what) {
  broken_ = true;
  last_error_ = std::string(what) + ": " +
                std::string(trimmed(conn_ ? PQerrorMessage(conn_) : "no connection"));
  spdlog::warn("postgres connection lost: {}", last_error_);
  return store_errc::unavailable;
}

boost::system::error_code PgConnection::wait_failed(boost::system::error_code ec) {
  // Cancelled: the deadline won and the caller reports the timeout.
  if (ec == asio::error::operation_aborted) {
    broken_ = true;
    return store_errc::timed_out;
  }
  return lost(("wait for socket: " + ec.message()).c_str());
}

bool PgConnection::attach_socket() {
  // libpq closes its socket by itself: between PQconnectPoll calls (next host in the list, SSL
  // or GSS fallback) and whenever it finds the connection lost (pqDropConnection). Had Asio
  // registered that descriptor, it would deregister the number later, after another thread may
  // have been given it for a new client connection, whose reads would then never be reported.
  // So Asio waits on a duplicate that only this object closes: readiness is the same (one
  // socket), and the number stays ours until socket_ is reset. Wrapped afresh at each connect
  // step, since libpq may have opened another socket.
  socket_.reset();
  const int fd = PQsocket(conn_);
  if (fd < 0) return false;
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return false;
  socket_.emplace(timer_.get_executor(), own);
  return true;
}

asio::awaitable<boost::system::result<void>> PgConnection::connect(Deadline deadline) {
  if (conn_ || broken_) co_return store_errc::unavailable;
  auto opening = open();
  co_return co_await within(std::move(opening), deadline, "connect timed out", nullptr);
}

asio::awaitable<boost::system::result<void>> PgConnection::open() {
  // Entries before the expanded dbname are overridden by the DSN's own settings.
  const char* keys[] = {"fallback_application_name", "dbname", nullptr};
  const char* values[] = {"idemgate", dsn_.c_str(), nullptr};
  conn_ = PQconnectStartParams(keys, values, /*expand_dbname=*/1);
  if (!conn_) {
    broken_ = true;
    last_error_ = "out of memory";
    co_return store_errc::unavailable;
  }
  PQsetNoticeProcessor(conn_, &forward_notice, nullptr);
  if (PQstatus(conn_) == CONNECTION_BAD) co_return lost("connect");

  // libpq: behave as if the last poll had asked for write readiness.
  PostgresPollingStatusType polling = PGRES_POLLING_WRITING;
  while (polling != PGRES_POLLING_OK) {
    if (polling == PGRES_POLLING_FAILED) co_return lost("connect");
    if (!attach_socket()) co_return lost("connect");
    const auto wait = polling == PGRES_POLLING_READING ? asio::posix::descriptor_base::wait_read
                                                       : asio::posix::descriptor_base::wait_write;
    auto [ec] = co_await socket_->async_wait(wait, use_nothrow);
    if (ec) co_return wait_failed(ec);
    polling = PQconnectPoll(conn_);
  }
  if (!attach_socket()) co_return lost("connect");
  if (PQsetnonblocking(conn_, 1) != 0) co_return lost("PQsetnonblocking");
  if (!prepared_statements_) {
    // Behind a transaction pooler the next statement may run on another server session: no
    // session state at all (SPEC C44).
    connected_ = true;
    co_return boost::system::result<void>{};
  }
  // A SET rather than an `options` connection parameter, which an `options` in the DSN would
  // silently replace.
  std::vector<Param> timeout;
  timeout.push_back(Param::text(std::to_string(statement_timeout_.count())));
  auto set =
      co_await run_unprepared(key_plans_ ? "SELECT set_config('statement_timeout', $1, false),"
                                           " set_config('enable_seqscan', 'off', false),"
                                           " set_config('plan_cache_mode', 'force_generic_plan',"
                                           " false)"
                                         : "SELECT set_config('statement_timeout', $1, false)",
                              std::move(timeout));
  if (!set) {
    broken_ = true;
    co_return set.error();
  }
  connected_ = true;
  co_return boost::system::result<void>{};
}

asio::awaitable<boost::system::result<PgResult>> PgConnection::execute(Statement statement,
                                                                       std::vector<Param> params,
                                                                       Deadline deadline) {
  if (!connected_) co_return store_errc::unavailable;
  auto run = run_prepared(statement, std::move(params));
  co_return co_await within(std::move(run), deadline, "statement timed out", statement.name);
}

asio::awaitable<boost::system::result<PgResult>> PgConnection::query(std::string sql,
                                                                     std::vector<Param> params,
                                                                     Deadline deadline) {
  if (!connected_) co_return store_errc::unavailable;
  auto run = run_unprepared(std::move(sql), std::move(params));
  co_return co_await within(std::move(run), deadline, "query timed out", nullptr);
}

// One operation at a time (the connect, or a statement), under its deadline. The deadline is a
// timer whose handler cancels the socket wait the operation is suspended in (arm_deadline),
// not a parallel group racing two spawned coroutines (bench/RESULTS.md, "The statement
// deadline without a parallel group").
template <class T>
asio::awaitable<boost::system::result<T>> PgConnection::within(
    asio::awaitable<boost::system::result<T>> operation, Deadline deadline, const char* what,
    const char* name) {
  if (broken_ || busy_) co_return store_errc::unavailable;
  busy_ = true;
  arm_deadline(deadline);
  auto done = co_await std::move(operation);
  disarm_deadline();
  if (!done && deadline_passed_) {
    // The deadline cancelled the wait: the outcome is unknown, and the connection is
    // mid-operation (wait_failed marked it broken).
    broken_ = true;
    last_error_ = name ? std::string(what) + ": " + name : std::string(what);
    spdlog::warn("postgres: {}", last_error_);
    co_return store_errc::timed_out;
  }
  busy_ = false;
  co_return std::move(done);
}

// An operation only suspends in a wait on the socket, so cancelling the socket's waits when
// the timer expires ends it (wait_failed: timed_out). The handler of an expiry already queued
// when its operation ended belongs to an older generation and does nothing; one queued when
// this object was destroyed finds `alive_` expired. One io thread: no check races a change.
void PgConnection::arm_deadline(Deadline deadline) {
  deadline_passed_ = false;
  const std::uint64_t generation = ++deadline_generation_;
  timer_.expires_at(deadline);
  timer_.async_wait(
      [this, generation, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec) {
        if (ec || alive.expired() || generation != deadline_generation_) return;
        deadline_passed_ = true;
        if (socket_) {
          boost::system::error_code ignored;
          socket_->cancel(ignored);
        }
      });
}

void PgConnection::disarm_deadline() noexcept {
  ++deadline_generation_;
  timer_.cancel();
}

asio::awaitable<boost::system::result<PgResult>> PgConnection::run_prepared(
    Statement statement, std::vector<Param> params) {
  if (!prepared_statements_) co_return co_await run_unprepared(statement.sql, std::move(params));
  if (!WireParams::fits(params)) co_return store_errc::protocol;
  if (!prepared_.contains(statement.name)) {
    if (!PQsendPrepare(conn_, statement.name, statement.sql, 0, nullptr)) {
      co_return lost("PQsendPrepare");
    }
    auto prepared = co_await finish_command();
    if (!prepared) co_return prepared.error();
    prepared_.insert(statement.name);
  }
  const WireParams wire(params);
  if (!PQsendQueryPrepared(conn_, statement.name, wire.count(), wire.values.data(),
                           wire.lengths.data(), wire.formats.data(), kBinaryResults)) {
    co_return lost("PQsendQueryPrepared");
  }
  co_return co_await finish_command();
}

asio::awaitable<boost::system::result<PgResult>> PgConnection::run_unprepared(
    std::string sql, std::vector<Param> params) {
  if (!WireParams::fits(params)) co_return store_errc::protocol;
  const WireParams wire(params);
  if (!PQsendQueryParams(conn_, sql.c_str(), wire.count(), nullptr, wire.values.data(),
                         wire.lengths.data(), wire.formats.data(), kBinaryResults)) {
    co_return lost("PQsendQueryParams");
  }
  co_return co_await finish_command();
}

asio::awaitable<boost::system::result<PgResult>> PgConnection::finish_command() {
  using wait = asio::posix::descriptor_base;
  for (;;) {
    const int flushed = PQflush(conn_);
    if (flushed == 0) break;
    if (flushed < 0) co_return lost("PQflush");
    // libpq: while output is pending, wait for either direction; the server may be blocked
    // writing to us (notices), so input has to be consumed before it accepts more.
    auto ready = co_await (socket_->async_wait(wait::wait_write, use_nothrow) ||
                           socket_->async_wait(wait::wait_read, use_nothrow));
    const auto ec = std::visit([](const auto& r) { return std::get<0>(r); }, ready);
    if (ec) co_return wait_failed(ec);
    if (ready.index() == 1 && !PQconsumeInput(conn_)) co_return lost("PQconsumeInput");
  }

  PgResult last;
  boost::system::error_code first_error;
  for (;;) {
    while (PQisBusy(conn_)) {
      auto [ec] = co_await socket_->async_wait(wait::wait_read, use_nothrow);
      if (ec) co_return wait_failed(ec);
      if (!PQconsumeInput(conn_)) co_return lost("PQconsumeInput");
    }
    PGresult* raw = PQgetResult(conn_);
    if (!raw) break;  // the command is complete only once PQgetResult says so
    const ExecStatusType status = PQresultStatus(raw);
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_EMPTY_QUERY) {
      last = PgResult(raw);
      continue;
    }
    PgResult failed(raw);
    if (first_error) continue;
    const char* sqlstate = PQresultErrorField(raw, PG_DIAG_SQLSTATE);
    const std::string_view state = sqlstate ? sqlstate : "";
    last_error_ = std::string(state) + " " + std::string(trimmed(PQresultErrorMessage(raw)));
    if (status != PGRES_FATAL_ERROR) {
      broken_ = true;  // COPY or a malformed answer: nothing this client can continue from
      first_error = store_errc::protocol;
    } else if (state == "23505") {
      first_error = store_errc::conflict;
    } else if (state == "57014") {
      first_error = store_errc::timed_out;  // statement_timeout on the server
    } else if (state.empty() || state.starts_with("08") || state.starts_with("57P") ||
               state == "25006") {
      // No SQLSTATE: libpq's own error (connection lost). 25006: a write refused as read-only,
      // so this host is a standby now (a demoted primary, SPEC C43): never reuse it.
      broken_ = true;
      first_error = store_errc::unavailable;
    } else if (state.starts_with("53")) {
      first_error = store_errc::unavailable;  // out of resources: too many connections, disk
    } else {
      first_error = store_errc::protocol;
    }
    if (first_error == store_errc::conflict) {
      spdlog::debug("postgres: {}", last_error_);
    } else {
      spdlog::warn("postgres: {}", last_error_);
    }
  }
  if (PQstatus(conn_) == CONNECTION_BAD) co_return lost("connection");
  if (first_error) co_return first_error;
  co_return last;
}

bool PgConnection::probe_idle() {
  if (!connected_ || broken_ || busy_) return false;
  if (PQtransactionStatus(conn_) != PQTRANS_IDLE) {
    // Left inside a transaction by its last user: its state would leak into the next one.
    broken_ = true;
    last_error_ = "connection returned inside a transaction";
    spdlog::warn("postgres: {}", last_error_);
    return false;
  }
  const int fd = PQsocket(conn_);
  // PQconsumeInput returns after one read that got data, so a FATAL message followed by EOF
  // (pg_terminate_backend, server shutdown) takes more than one call to show the EOF; peek until
  // the socket has nothing more to give.
  for (int round = 0; round < 16; ++round) {
    char byte;
    const auto n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      broken_ = true;
      last_error_ = "server closed the connection";
      spdlog::info("postgres: idle connection closed by the server; reconnecting");
      return false;
    }
    if (!PQconsumeInput(conn_) || PQstatus(conn_) == CONNECTION_BAD) {
      lost("idle connection");
      return false;
    }
  }
  return true;
}

}  // namespace idemgate::storage::pg
