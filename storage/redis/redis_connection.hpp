#pragma once
// One hiredis 0.14 async context driven by an Asio io_context. hiredis ships no Asio adapter and
// no timers, so this file supplies both: Asio reads the replies and hiredis parses them, the
// commands of one loop turn leave in one write, and every command carries a deadline kept by a
// steady_timer.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
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

/// One command as its binary-safe arguments: `{"SET", key, value}`.
using Command = std::vector<std::string>;

/// Appends `argv` to `out` in the form a client sends a command (RESP: an array of bulk strings,
/// `*N\r\n`, then `$len\r\n` + the argument's bytes + `\r\n` for each), byte for byte what
/// hiredis's `redisFormatCommandArgv` writes, without its `printf` per argument.
void append_resp_command(std::string& out, const Command& argv);

/// What undoes a lock command whose reply was lost (SPEC C25): a script on one key with one
/// argument, the lock's compare-and-delete of its own token, so it may run any number of times,
/// at any later moment, without touching anyone else's lock. The command (`EVAL script 1 key
/// arg`) is built only when it has to run: a call carries just the key and the token.
struct Undo {
  // Not an aggregate: GCC 12 mishandles an aggregate temporary passed to a coroutine by value.
  Undo() = default;
  /// `script` must outlive every connection (a string literal).
  Undo(std::string_view lua, std::string on_key, std::string argument)
      : script(lua), key(std::move(on_key)), arg(std::move(argument)) {}

  std::string_view script;  ///< empty: nothing to undo
  std::string key;          ///< the one key the script touches (a cluster routes on it)
  std::string arg;

  explicit operator bool() const noexcept { return !script.empty(); }
  /// `EVAL`, not `EVALSHA`: an undo runs on whatever server answers next, whose script cache
  /// may be empty, and nothing would be there to load it again.
  Command command() const { return {"EVAL", std::string(script), "1", key, arg}; }
};

/// A Redis connection for one io thread: a single hiredis async context, opened lazily by the
/// first command and re-opened by the first command after it was lost, so a Redis restart needs
/// no gateway restart (SPEC C25).
///
/// Connecting: `address` is used as is when it is an IP literal, otherwise it is resolved with
/// Asio first (hiredis would resolve blocking). After the TCP connect, `AUTH password`, or
/// `AUTH username password` for an ACL user (when a password is set), and `SELECT db` (when db !=
/// 0) are the first commands on the connection. A `data` connection then asks `CLIENT ID` and
/// sends commands only once it is answered, so that every command it sends went out on a
/// connection the server can name (see Undo below); a `control` connection (a sentinel)
/// pipelines its commands right behind the handshake.
///
/// Deadlines: every call ends within `operation_timeout` of being issued, connecting
/// included. A call that misses its deadline returns `store_errc::timed_out` and the
/// connection is torn down: it may be dead or half-open, and replies are FIFO, so every command
/// queued behind the missing reply would wait for it too. The calls still in flight on it end
/// with `timed_out` as well; the next call opens a new connection.
///
/// Undo (SPEC C25, C41): a call may carry an Undo. When its commands were written and their
/// replies are lost (timed out, connection reset, connection destroyed with it in flight), the
/// commands may still run on the server later — a frozen server runs what sits in its socket
/// buffer when it resumes, a torn-down connection's bytes may still be in flight. The
/// connection keeps the undo (at most kMaxUndos; the oldest go first) and, as soon as the server
/// answers on a new connection, sends `CLIENT KILL ID n` for every old connection that carried
/// such a call and then the undos, before any other command on that connection. Without the
/// caller sending anything, it reconnects for them by itself, with a backoff while the server
/// stays away. A caller cancelled with an undo-carrying call in flight has its undo sent right
/// behind the call on the same connection.
///
/// Errors: `store_errc::unavailable` (cannot connect, connection lost; a command may or may not
/// have run), `timed_out`, `protocol` (AUTH or SELECT refused). A Redis error reply (`-ERR ...`)
/// is not an error here: it is returned as a `Reply` of kind `error` for the caller to judge.
///
/// Pipelining: any number of calls may be in flight at once (from several coroutines); their
/// replies are matched in order. Commands issued in one turn of the event loop leave in one
/// write.
///
/// Thread safety: none. Use from the thread running the executor's io_context; the connection
/// must be destroyed before that io_context. Calls still in flight when it is destroyed end
/// with `unavailable`.
///
/// hiredis writes with write(2), so the process must ignore SIGPIPE.
class RedisConnection {
 public:
  /// What the server is for: `data` (a Redis server holding locks: learns its connection id,
  /// keeps undos) or `control` (a sentinel: neither).
  enum class Kind { data, control };

  /// Undos kept per connection at most; a lock whose undo was dropped expires after its ttl.
  static constexpr std::size_t kMaxUndos = 1024;

  RedisConnection(boost::asio::any_io_executor executor, config::Redis options,
                  Kind kind = Kind::data);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// Sends `commands` back to back on one connection, with nothing in between, and returns
  /// their replies in order. All end within one operation_timeout. `undo` (may be empty) as in
  /// the class comment. Errors as in the class comment. If the awaiting coroutine is cancelled
  /// (per-operation cancellation), returns `asio::error::operation_aborted` at once; the
  /// commands stay in flight and their replies are dropped.
  boost::asio::awaitable<boost::system::result<std::vector<Reply>>> execute(
      std::vector<Command> commands, Undo undo);

  /// execute() without an undo. (Not a default argument: GCC 12 destroys a coroutine's default
  /// argument twice.)
  boost::asio::awaitable<boost::system::result<std::vector<Reply>>> execute(
      std::vector<Command> commands) {
    return execute(std::move(commands), Undo{});
  }

  /// Sends one command and returns its reply.
  boost::asio::awaitable<boost::system::result<Reply>> execute(Command command);

  /// `execute` with the arguments spelled out: `command("PEXPIRE", key, "100")`.
  template <class... Args>
  requires(std::is_constructible_v<std::string, Args&&>&&...)
      boost::asio::awaitable<boost::system::result<Reply>> command(Args&&... args) {
    Command argv;
    argv.reserve(sizeof...(Args));
    (argv.emplace_back(std::forward<Args>(args)), ...);
    return execute(std::move(argv));
  }

  /// Undos not yet confirmed by the server.
  std::size_t pending_undos() const noexcept;

  /// Takes every pending undo away (a connection being retired hands them to the one that
  /// serves their keys now).
  std::vector<Undo> take_undos();

  /// Adds undos taken from a connection to another server (nothing there to kill), and
  /// reconnects for them.
  void adopt_undos(std::vector<Undo> undos);

  /// Where an undo goes that this server refused without running it because the key is served
  /// elsewhere now (`MOVED`, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`), with that refusal; unset:
  /// dropped. (`ASK`, `TRYAGAIN`, `LOADING`, `BUSY` are tried here again later.)
  void on_refused_undo(std::function<void(Undo, const Reply&)> handler);

  /// Number of connections opened so far (the first one included); for metrics and tests.
  std::uint64_t connect_count() const noexcept;

  /// The server's address and port as configured.
  const std::string& address() const noexcept;
  std::uint16_t port() const noexcept;

 private:
  class Session;  // one hiredis context and its Asio hooks
  struct State;   // what outlives a session: options, undos, the recovery timer
  struct Op;      // one call from issue to completion

  std::shared_ptr<State> state_;
};

}  // namespace idemgate::storage::redis
