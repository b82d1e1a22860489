#pragma once
// One hiredis 0.14 async context driven by an Asio io_context. hiredis ships no Asio adapter and
// no timers, so this file supplies both: the `ev` hooks wait for readiness on a
// posix::stream_descriptor, and every command carries a deadline kept by a steady_timer.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/core/errors.hpp"

struct redisReply;  // hiredis

namespace idemgate::storage::redis {

/// An owned copy of a `redisReply` (hiredis frees its own after the reply callback returns).
struct Reply {
  enum class Kind { string, array, integer, nil, status, error };

  Kind kind = Kind::nil;
  std::string str;              ///< string, status and error replies (binary-safe)
  long long integer = 0;        ///< integer replies
  std::vector<Reply> elements;  ///< array replies

  bool is_nil() const noexcept { return kind == Kind::nil; }
  bool is_error() const noexcept { return kind == Kind::error; }
  /// A status reply with exactly this text (`OK`, `PONG`, ...).
  bool is_status(std::string_view text) const noexcept {
    return kind == Kind::status && str == text;
  }
};

/// An owned copy of `reply`, arrays included (for hiredis callbacks and blocking tools alike).
Reply copy_reply(const redisReply& reply);

/// A Redis connection for one io thread: a single hiredis async context, opened lazily by the
/// first command and re-opened by the first command after it was lost, so a Redis restart needs
/// no gateway restart (SPEC C25).
///
/// Connecting: `address` is used as is when it is an IP literal, otherwise it is resolved with
/// Asio first (hiredis would resolve blocking). After the TCP connect, `AUTH password`, or
/// `AUTH username password` for an ACL user (when a password is set), and `SELECT db` (when db !=
/// 0) are the first commands on the connection.
///
/// Deadlines: every command ends within `operation_timeout` of being issued, connecting
/// included. A command that misses its deadline returns `store_errc::timed_out` and the
/// connection is torn down: it may be dead or half-open, and replies are FIFO, so every command
/// queued behind the missing reply would wait for it too. The commands still in flight on it end
/// with `timed_out` as well; the next command opens a new connection.
///
/// Errors: `store_errc::unavailable` (cannot connect, connection lost; a command may or may not
/// have run), `timed_out`, `protocol` (AUTH or SELECT refused). A Redis error reply (`-ERR ...`)
/// is not an error here: it is returned as a `Reply` of kind `error` for the caller to judge.
///
/// Pipelining: any number of commands may be in flight at once (from several coroutines); their
/// replies are matched in order.
///
/// Thread safety: none. Use from the thread running the executor's io_context; the connection
/// must be destroyed before that io_context. Commands still in flight when it is destroyed end
/// with `unavailable`.
///
/// hiredis writes with write(2), so the process must ignore SIGPIPE.
class RedisConnection {
 public:
  RedisConnection(boost::asio::any_io_executor executor, config::Redis options);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// Sends one command, given as its binary-safe arguments (`{"SET", key, value}`), and waits
  /// for its reply. Errors as in the class comment. If the awaiting coroutine is cancelled
  /// (per-operation cancellation), returns `asio::error::operation_aborted` at once; the command
  /// stays in flight and its reply is dropped.
  boost::asio::awaitable<boost::system::result<Reply>> execute(std::vector<std::string> argv);

  /// Sends `ASKING` and then `argv` back-to-back on this connection, with nothing in between,
  /// and returns the reply to `argv` (the reply to `ASKING` is not awaited: when it failed, the
  /// command's own reply says so). A Redis Cluster node answers a command for a slot it is
  /// importing only right after `ASKING` on the same connection (SPEC C42). Errors and
  /// cancellation as in execute.
  boost::asio::awaitable<boost::system::result<Reply>> execute_asking(
      std::vector<std::string> argv);

  /// Sends `argv` and then `then` back-to-back on this connection (after `ASKING` when
  /// `asking`), with nothing in between, and returns both replies. `WAIT` must follow the write
  /// it waits for on the same connection: it counts the replication offset of this connection
  /// only (SPEC C41). Both end within one operation_timeout. Errors and cancellation as in
  /// execute (either command's error fails the pair).
  boost::asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_then(
      std::vector<std::string> argv, std::vector<std::string> then, bool asking = false);

  /// `execute` with the arguments spelled out: `command("PEXPIRE", key, "100")`.
  template <class... Args>
  requires(std::is_constructible_v<std::string, Args&&>&&...)
      boost::asio::awaitable<boost::system::result<Reply>> command(Args&&... args) {
    std::vector<std::string> argv;
    argv.reserve(sizeof...(Args));
    (argv.emplace_back(std::forward<Args>(args)), ...);
    return execute(std::move(argv));
  }

  /// Number of connections opened so far (the first one included); for metrics and tests.
  std::uint64_t connect_count() const noexcept { return connect_count_; }

 private:
  class Session;  // one hiredis context and its Asio hooks

  std::shared_ptr<Session> session();
  boost::asio::awaitable<boost::system::result<Reply>> run(std::vector<std::string> argv,
                                                           bool asking);

  boost::asio::any_io_executor executor_;
  config::Redis options_;
  std::shared_ptr<Session> session_;
  std::uint64_t connect_count_ = 0;
};

}  // namespace idemgate::storage::redis
