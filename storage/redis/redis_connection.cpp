#include "storage/redis/redis_connection.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

// Runs the callbacks of the replies hiredis's reader holds, as redisAsyncHandleRead does after
// its read. Exported by every hiredis release with the async API; declared in async.h from 1.0
// on (the same declaration).
extern "C" void redisProcessCallbacks(redisAsyncContext* ac);

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <chrono>
#include <deque>
#include <optional>

#include "gateway/common/use_nothrow.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using core::store_errc;

using common::use_nothrow;

/// Pause before the first reconnect for undos after a failed attempt, doubled per failure up to
/// kRecoveryMax while the server stays away. The first attempt goes at once.
constexpr std::chrono::milliseconds kRecoveryFirst{50};
constexpr std::chrono::milliseconds kRecoveryMax{500};

/// The largest command buffer a session keeps between commands (the lock's are about 150 bytes).
constexpr std::size_t kKeptWireBytes = 64 * 1024;

bool starts_with_any(const std::string& text, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](std::string_view p) { return text.starts_with(p); });
}

/// A reply saying the command did not run here because the key is served elsewhere now.
bool refused_elsewhere(const Reply& r) {
  return r.is_error() &&
         (starts_with_any(r.str, {"MOVED ", "READONLY", "MASTERDOWN", "CLUSTERDOWN"}) ||
          r.str.find("-READONLY") != std::string::npos);
}

/// A reply saying the command did not run yet but may run here later: a server loading its
/// data or running a script, a slot being migrated (the key is not here while it moves; once
/// moved, the answer is MOVED).
bool refused_for_now(const Reply& r) {
  return r.is_error() && starts_with_any(r.str, {"LOADING", "BUSY", "ASK ", "TRYAGAIN"});
}

}  // namespace

void append_resp_command(std::string& out, const Command& argv) {
  const auto number = [&out](char tag, std::size_t n) {
    char text[24];
    text[0] = tag;
    char* end = std::to_chars(text + 1, text + sizeof text - 2, n).ptr;
    *end++ = '\r';
    *end++ = '\n';
    out.append(text, end);
  };
  number('*', argv.size());
  for (const auto& arg : argv) {
    number('$', arg.size());
    out.append(arg);
    out.append("\r\n", 2);
  }
}

Reply copy_reply(const redisReply& r) {
  Reply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.kind = Reply::Kind::string;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.kind = Reply::Kind::status;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.kind = Reply::Kind::error;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.kind = Reply::Kind::integer;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.kind = Reply::Kind::array;
      out.elements.reserve(r.elements);
      for (std::size_t i = 0; i < r.elements; ++i)
        out.elements.push_back(copy_reply(*r.element[i]));
      break;
    default:
      out.kind = Reply::Kind::nil;
      break;
  }
  return out;
}

/// One call from issue to completion: its commands, their replies so far and how it ended. A
/// caller's coroutine sleeps on `deadline`; the last reply (or the failure) cancels the timer,
/// which only queues the coroutine on the io_context (never resumed inside a hiredis callback).
/// Calls the connection makes itself (undos) have `on_done` instead of a waiting coroutine. A
/// call not sent yet may move to a newer session (its handshake timed out); a sent one stays.
struct RedisConnection::Op {
  Op(asio::any_io_executor executor, std::vector<Command> cmds, Undo u)
      : deadline(std::move(executor)), commands(std::move(cmds)), undo(std::move(u)) {}

  void reply(Reply r) {
    if (done) return;
    replies.push_back(std::move(r));
    if (replies.size() == commands.size()) finish();
  }
  void fail(error_code ec) {
    if (done) return;
    failed = ec;
    finish();
  }

  asio::steady_timer deadline;
  std::vector<Command> commands;
  Undo undo;
  std::vector<Reply> replies;
  std::optional<error_code> failed;
  bool done = false;
  bool sent = false;       ///< written (or about to be) on a connected session
  bool abandoned = false;  ///< the caller stopped waiting
  bool undo_kept = false;  ///< its undo went to the State once
  std::function<void(Op&)> on_done;
  std::weak_ptr<Session> session;  ///< where it waits or was sent

 private:
  void finish() {
    done = true;
    deadline.cancel();
    if (on_done) std::exchange(on_done, nullptr)(*this);
  }
};

/// What outlives a session: the options, the undos of lost calls and the connections they went
/// out on, and the timer that reconnects for them.
///
/// Why `CLIENT KILL ID` before the undos. A call whose reply was lost was written on a
/// connection this side has closed; its bytes may still reach the server's command loop
/// afterwards: a server frozen (SIGSTOP, `DEBUG SLEEP`, a long fork) runs what sits in the
/// socket buffer when it resumes, and a connection closed on this side still delivers its
/// unsent bytes. Replies are FIFO per connection only: a compare-and-delete sent on a new
/// connection can run before the old connection's `SET … NX` when both wait in a frozen
/// server's buffers, and then the late SET leaves a lock nobody owns. So the new connection
/// first sends `CLIENT KILL ID n` for the old one (its id learnt by `CLIENT ID` before anything
/// else was sent on it). Redis runs commands on one thread: when the kill runs, the old client
/// is freed (or flagged close-ASAP when it is mid-I/O, and processInputBuffer runs nothing more
/// for such a client); its query buffer and unread socket bytes are discarded with it. The
/// kill either finds it (killed now) or does not (already gone: its EOF was read, after
/// whatever it carried had run). Either way nothing from it can run after the kill's reply,
/// and the undos sent behind the kill on the same connection run after it, so they see every
/// late write there will ever be. Client ids only grow within one server run: a kill of an id
/// at or above the new connection's own would name a connection of a restarted server, and
/// a restart has closed the old one anyway, so such ids are dropped instead of killed. Without
/// `client|id` or `client|kill` (an ACL user limited to the lock commands) the undos are sent
/// without the kill: that still removes every late write the server ran before the new
/// connection's commands.
struct RedisConnection::State : std::enable_shared_from_this<State> {
  State(asio::any_io_executor ex, config::Redis o, Kind k)
      : executor(std::move(ex)), options(std::move(o)), kind(k), retry(executor) {}

  struct Kept {
    std::uint64_t seq = 0;
    Undo undo;
  };

  std::shared_ptr<Session> live_session();
  void open_session();
  void keep(Undo undo, std::optional<long long> connection_id);
  void on_ready(Session& session);
  void round_done(const std::vector<long long>& kills_sent, const std::vector<std::uint64_t>& sent,
                  Op& op);
  void session_closed();
  void recover();
  void retry_later();

  asio::any_io_executor executor;
  config::Redis options;
  Kind kind;
  std::shared_ptr<Session> session;
  std::uint64_t connects = 0;
  bool closing = false;
  bool id_refused = false;    ///< the server refused `CLIENT ID` (ACL): undo without a kill
  bool kill_refused = false;  ///< the server refused `CLIENT KILL`
  std::deque<Kept> undos;
  std::vector<long long> kills;  ///< ids of connections that carried lost calls
  std::uint64_t next_seq = 0;
  asio::steady_timer retry;
  bool retry_armed = false;
  std::chrono::milliseconds backoff{0};
  std::function<void(Undo, const Reply&)> refused;
};

class RedisConnection::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::any_io_executor executor, const config::Redis& options, Kind kind,
          std::weak_ptr<State> state)
      : options_(options),
        kind_(kind),
        state_(std::move(state)),
        resolver_(executor),
        socket_(executor),
        handshake_(executor) {}

  ~Session() { close(store_errc::unavailable); }

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool closed() const noexcept { return closed_; }
  bool ready() const noexcept { return ready_ && !closed_; }
  bool recovering() const noexcept { return recovering_; }
  void set_recovering(bool on) noexcept { recovering_ = on; }
  /// The server's id for this connection (`CLIENT ID`), once known.
  std::optional<long long> id() const noexcept { return id_; }

  void start() {
    // Nothing is sent before the handshake answers; a server that accepts and stays silent
    // must not keep this session (and the commands waiting on it) forever.
    handshake_.expires_after(options_.operation_timeout);
    handshake_.async_wait([weak = weak_from_this()](error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->ready_ || self->closed_) return;
      // The calls waiting here were never sent: they move to a new session and keep their own
      // deadlines, so one issued just as the server came back is not failed by this session's
      // older deadline.
      auto waiting = std::exchange(self->waiting_, {});
      self->close(store_errc::timed_out);
      auto state = self->state_.lock();
      if (!state || state->closing) {
        for (auto& op : waiting) op->fail(make_error_code(store_errc::timed_out));
        return;
      }
      std::shared_ptr<Session> next;
      for (auto& op : waiting) {
        if (op->done) continue;
        if (!next) next = state->live_session();
        next->submit(std::move(op));
      }
    });
    error_code ec;
    const auto ip = asio::ip::make_address(options_.address, ec);
    if (!ec) {
      connect(ip.to_string());
      return;
    }
    // redisAsyncConnect would call getaddrinfo on the io thread; resolve with Asio first.
    resolver_.async_resolve(
        options_.address, std::to_string(options_.port),
        [self = shared_from_this()](error_code rec, asio::ip::tcp::resolver::results_type found) {
          if (self->closed_) return;
          if (rec || found.empty()) return self->close(store_errc::unavailable);
          self->connect(found.begin()->endpoint().address().to_string());
        });
  }

  /// Sends `op` now, or once the handshake answered; fails it at once when the session is
  /// closed.
  void submit(std::shared_ptr<Op> op) {
    if (closed_) return op->fail(make_error_code(reason_));
    op->session = weak_from_this();
    if (!ready_) return waiting_.push_back(std::move(op));
    send(std::move(op));
  }

  /// Sends a call the connection makes itself (no coroutine waits for it): its own deadline
  /// tears the session down like a caller's would.
  void submit_internal(std::shared_ptr<Op> op) {
    op->deadline.expires_after(options_.operation_timeout);
    op->deadline.async_wait([weak = weak_from_this(), op](error_code) {
      if (op->done) return;
      if (auto self = weak.lock()) self->close(store_errc::timed_out);
    });
    submit(std::move(op));
  }

  /// Tears the connection down: everything in flight on it ends with `reason`. Safe to call from
  /// inside a reply callback (hiredis defers the free until the callback returns) and twice.
  void close(store_errc reason) {
    if (closed_) return;
    closed_ = true;
    reason_ = reason;
    resolver_.cancel();
    handshake_.cancel();
    end_waiting();
    // Runs every pending reply callback with a NULL reply, then the cleanup hook.
    if (ac_) redisAsyncFree(ac_);
    finished();
  }

 private:
  void connect(const std::string& ip) {
    redisAsyncContext* ac = redisAsyncConnect(ip.c_str(), options_.port);
    if (ac == nullptr) return close(store_errc::unavailable);
    if (ac->err != 0) {
      redisAsyncFree(ac);  // no hooks attached yet: this only frees memory and the socket
      return close(store_errc::unavailable);
    }
    error_code ec;
    socket_.assign(ac->c.fd, ec);
    if (ec) {
      redisAsyncFree(ac);
      return close(store_errc::unavailable);
    }
    ac_ = ac;
    ac->data = this;
    ac->ev.data = this;
    ac->ev.addRead = &Session::add_read;
    ac->ev.delRead = &Session::del_read;
    ac->ev.addWrite = &Session::add_write;
    ac->ev.delWrite = &Session::del_write;
    ac->ev.cleanup = &Session::cleanup;
    // Setting the connect callback arms the first write wait: hiredis learns that the
    // non-blocking connect finished from the first writability event, so the hooks come first.
    redisAsyncSetConnectCallback(ac, &Session::on_connect);
    redisAsyncSetDisconnectCallback(ac, &Session::on_disconnect);

    // Replies are FIFO: AUTH and SELECT answer before anything sent behind them.
    if (!options_.password.empty()) {
      send_setup(options_.username.empty() ? Command{"AUTH", options_.password}
                                           : Command{"AUTH", options_.username, options_.password});
    }
    if (options_.db != 0) send_setup({"SELECT", std::to_string(options_.db)});
    auto state = state_.lock();
    if (kind_ == Kind::data && state && !state->id_refused && !closed_) {
      // Every command of a data connection goes out on a connection whose id is known, so
      // that a later connection can kill this one before undoing what was lost on it.
      if (!append({"CLIENT", "ID"}, &Session::on_id_reply, nullptr)) close(store_errc::unavailable);
      return;
    }
    become_ready();
  }

  void become_ready() {
    if (closed_ || ready_) return;
    ready_ = true;
    handshake_.cancel();
    // The undos first: on the server they run before anything queued behind them.
    if (auto state = state_.lock()) state->on_ready(*this);
    while (!waiting_.empty() && !closed_) {
      auto op = std::move(waiting_.front());
      waiting_.pop_front();
      if (!op->done) send(std::move(op));  // done: timed out before it could go, never sent
    }
  }

  bool append(const Command& argv, redisCallbackFn* fn, void* privdata) {
    // Formatted here (hiredis's own formatting printfs every length), into a buffer the
    // session reuses; hiredis copies it into its output buffer.
    wire_.clear();
    append_resp_command(wire_, argv);
    const bool appended =
        redisAsyncFormattedCommand(ac_, fn, privdata, wire_.data(), wire_.size()) == REDIS_OK;
    // A big value (a replay marker) does not keep its buffer for the session's life.
    if (wire_.capacity() > kKeptWireBytes) std::string().swap(wire_);
    return appended;
  }

  void send(std::shared_ptr<Op> op) {
    op->sent = true;
    for (const auto& command : op->commands) {
      // hiredis owns privdata until the callback runs, which it does exactly once (a NULL
      // reply when the context goes away).
      auto holder = std::make_unique<std::shared_ptr<Op>>(op);
      if (!append(command, &Session::on_reply, holder.get())) {
        lost(*op);
        return op->fail(make_error_code(store_errc::unavailable));
      }
      holder.release();
    }
  }

  void send_setup(Command argv) {
    if (!append(argv, &Session::on_setup_reply, nullptr)) close(store_errc::unavailable);
  }

  /// `op`'s replies will not come: its undo goes to the State (once), with this connection's
  /// id to kill first.
  void lost(Op& op) {
    if (!op.undo || !op.sent || op.undo_kept) return;
    op.undo_kept = true;
    if (auto state = state_.lock()) state->keep(op.undo, id_);
  }

  /// Fails the calls that were never sent (they did not run).
  void end_waiting() {
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& op : waiting) op->fail(make_error_code(reason_));
  }

  /// Tells the State once that this session is gone (it reconnects for what is left to undo).
  void finished() {
    if (notified_) return;
    notified_ = true;
    // Posted: this may run inside a hiredis callback or a destructor.
    if (auto state = state_.lock()) {
      asio::post(state->executor, [weak = state_] {
        if (auto s = weak.lock()) s->session_closed();
      });
    }
  }

  static Session& of(const void* p) { return *static_cast<Session*>(const_cast<void*>(p)); }

  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
    std::unique_ptr<std::shared_ptr<Op>> holder(static_cast<std::shared_ptr<Op>*>(privdata));
    auto op = *holder;
    auto& s = of(ac->data);
    if (reply == nullptr) {
      s.lost(*op);
      return op->fail(make_error_code(s.reason_));
    }
    op->reply(copy_reply(*static_cast<const redisReply*>(reply)));
    if (op->done && op->abandoned && op->undo && !s.closed_) {
      // Its caller is gone and will never release what the call may have taken: undo it now,
      // behind it on the same connection. Lost in turn, the undo is kept like any other.
      auto undo = std::make_shared<Op>(op->deadline.get_executor(),
                                       std::vector<Command>{op->undo.command()}, op->undo);
      s.submit_internal(std::move(undo));
    }
  }

  static void on_setup_reply(redisAsyncContext* ac, void* reply, void*) {
    auto* r = static_cast<const redisReply*>(reply);
    if (r != nullptr && r->type == REDIS_REPLY_ERROR) of(ac->data).close(store_errc::protocol);
  }

  static void on_id_reply(redisAsyncContext* ac, void* reply, void*) {
    auto* r = static_cast<const redisReply*>(reply);
    if (r == nullptr) return;
    auto& s = of(ac->data);
    if (r->type == REDIS_REPLY_INTEGER) {
      s.id_ = r->integer;
    } else if (auto state = s.state_.lock()) {
      state->id_refused = true;  // asked once per connection object, not on every reconnect
    }
    s.become_ready();
  }

  static void on_connect(const redisAsyncContext* ac, int status) {
    // On failure hiredis frees the context right after this returns; pending commands then get
    // NULL replies and end with reason_.
    if (status != REDIS_OK) of(ac->data).reason_ = store_errc::unavailable;
  }

  static void on_disconnect(const redisAsyncContext* ac, int) { of(ac->data).closed_ = true; }

  // The ev hooks. hiredis calls them again and again with the same state ("should be
  // idempotent"), so each only records the wish and keeps at most one wait per direction.
  static void add_read(void* p) {
    auto& s = of(p);
    s.want_read_ = true;
    s.arm_read();
  }
  static void del_read(void* p) { of(p).want_read_ = false; }
  static void add_write(void* p) {
    auto& s = of(p);
    s.want_write_ = true;
    s.schedule_flush();
  }
  static void del_write(void* p) { of(p).want_write_ = false; }

  /// hiredis closes the fd itself (redisFree), so Asio must let go of it first, or the reactor
  /// would keep a registration for a descriptor number the next socket may reuse. Called up to
  /// twice per context (disconnect, then free); the hooks are cleared so the second is a no-op.
  static void cleanup(void* p) {
    auto& s = of(p);
    if (s.ac_ != nullptr) s.ac_->ev = {};
    s.ac_ = nullptr;
    s.closed_ = true;
    s.want_read_ = s.want_write_ = false;
    s.handshake_.cancel();
    if (s.socket_.is_open()) s.socket_.release();  // pending waits end with operation_aborted
    s.end_waiting();  // hiredis gave up by itself (connect refused, EOF)
    s.finished();
  }

  bool connected() const noexcept { return ac_ != nullptr && (ac_->c.flags & REDIS_CONNECTED); }

  /// Replies are read by the reactor itself (a read operation, not a readiness wait): the
  /// descriptor stays registered as it is, with no `epoll_ctl` per wait, and the read that a
  /// readiness wait would be followed by is the one that completes the operation. Asio tries
  /// the read once when the operation starts: that `read` finds the next reply when replies
  /// follow each other, and nothing otherwise (it takes the re-arm's place). The bytes go to
  /// hiredis's reader and the replies to their callbacks, as redisAsyncHandleRead does after its
  /// own read. Until the non-blocking connect is done, hiredis's own path runs.
  void arm_read() {
    if (read_armed_ || ac_ == nullptr) return;
    read_armed_ = true;
    if (!connected()) {
      socket_.async_wait(asio::posix::stream_descriptor::wait_read,
                         [self = shared_from_this()](error_code ec) { self->on_readable(ec); });
      return;
    }
    socket_.async_read_some(
        asio::buffer(input_),
        [self = shared_from_this()](error_code ec, std::size_t n) { self->on_read(ec, n); });
  }

  /// Commands appended during one turn of the io loop leave in one write, made at the end of
  /// that turn without waiting for writability first (a connected socket almost always has room;
  /// when it has not, the rest waits for a writability event). Before the connect is done,
  /// hiredis learns of its end from the first writability event.
  void schedule_flush() {
    if (!connected()) return arm_write();
    if (flush_posted_ || write_armed_) return;
    flush_posted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->flush(); });
  }

  void flush() {
    // flush_posted_ stays set during the write, so that hiredis asking for another write
    // (some bytes left) does not post a second flush.
    if (ac_ != nullptr && want_write_) redisAsyncHandleWrite(ac_);
    flush_posted_ = false;
    if (ac_ != nullptr && want_write_) arm_write();  // the socket's buffer is full
  }

  void arm_write() {
    if (write_armed_ || ac_ == nullptr) return;
    write_armed_ = true;
    socket_.async_wait(asio::posix::stream_descriptor::wait_write,
                       [self = shared_from_this()](error_code ec) { self->on_writable(ec); });
  }

  // redisAsyncHandleRead/Write and redisProcessCallbacks may free the context (EOF, connect
  // refused, a protocol error): ac_ is re-checked after each call because the cleanup hook
  // resets it.
  void on_readable(error_code ec) {
    read_armed_ = false;
    if (ac_ == nullptr || ec == asio::error::operation_aborted) return;
    if (ec) return close(store_errc::unavailable);
    if (want_read_) redisAsyncHandleRead(ac_);
    if (ac_ != nullptr && want_read_) arm_read();
  }

  void on_read(error_code ec, std::size_t n) {
    read_armed_ = false;
    if (ac_ == nullptr || ec == asio::error::operation_aborted) return;
    // End of stream or a failed read: hiredis would disconnect the same way, failing what is
    // in flight.
    if (ec || ac_->c.err != 0) return close(store_errc::unavailable);
    // The reader only copies here (a malformed reply is found by redisProcessCallbacks, which
    // disconnects by itself); it fails only when out of memory.
    if (redisReaderFeed(ac_->c.reader, input_.data(), n) != REDIS_OK)
      return close(store_errc::unavailable);
    redisProcessCallbacks(ac_);
    if (ac_ != nullptr && want_read_) arm_read();
  }

  void on_writable(error_code ec) {
    write_armed_ = false;
    if (ac_ == nullptr || ec == asio::error::operation_aborted) return;
    if (ec) return close(store_errc::unavailable);
    if (want_write_) redisAsyncHandleWrite(ac_);
    if (ac_ != nullptr && want_write_) arm_write();
  }

  config::Redis options_;
  Kind kind_;
  std::weak_ptr<State> state_;
  asio::ip::tcp::resolver resolver_;
  asio::posix::stream_descriptor socket_;  ///< hiredis's descriptor, never closed by Asio
  asio::steady_timer handshake_;
  redisAsyncContext* ac_ = nullptr;
  std::deque<std::shared_ptr<Op>> waiting_;  // issued before the handshake answered
  std::optional<long long> id_;
  bool closed_ = false;
  bool ready_ = false;
  bool recovering_ = false;  // a round of kills and undos is in flight
  bool notified_ = false;
  store_errc reason_ = store_errc::unavailable;  // what in-flight commands end with on close
  bool want_read_ = false;
  bool want_write_ = false;
  bool read_armed_ = false;
  bool write_armed_ = false;
  bool flush_posted_ = false;
  std::string wire_;  ///< the command being appended, in RESP
  /// Where the reactor reads replies before hiredis parses them (hiredis reads 16 KiB a call).
  std::array<char, 16 * 1024> input_;
};

std::shared_ptr<RedisConnection::Session> RedisConnection::State::live_session() {
  if (!session || session->closed()) open_session();
  return session;
}

void RedisConnection::State::open_session() {
  session = std::make_shared<Session>(executor, options, kind, weak_from_this());
  ++connects;
  session->start();
}

void RedisConnection::State::keep(Undo undo, std::optional<long long> connection_id) {
  if (closing) return;
  if (undos.size() >= kMaxUndos) undos.pop_front();  // that lock expires after its ttl
  undos.push_back({next_seq++, std::move(undo)});
  if (connection_id && std::find(kills.begin(), kills.end(), *connection_id) == kills.end())
    kills.push_back(*connection_id);
}

void RedisConnection::State::on_ready(Session& s) {
  if (closing || undos.empty() || s.recovering() || !s.ready()) return;
  std::vector<Command> commands;
  std::vector<long long> kills_sent;
  std::vector<std::uint64_t> sent;
  const auto own = s.id();
  for (const long long id : kills) {
    // At or above our own id: a connection of an earlier server run, closed by its restart.
    if (kill_refused || !own || id >= *own) continue;
    commands.push_back({"CLIENT", "KILL", "ID", std::to_string(id)});
    kills_sent.push_back(id);
  }
  kills = kills_sent;  // the rest need no kill
  for (const auto& kept : undos) {
    commands.push_back(kept.undo.command());
    sent.push_back(kept.seq);
  }
  auto op = std::make_shared<Op>(executor, std::move(commands), Undo{});
  s.set_recovering(true);
  op->on_done = [weak = weak_from_this(), session = s.weak_from_this(), kills_sent,
                 sent](Op& done) {
    if (auto live = session.lock()) live->set_recovering(false);
    if (auto state = weak.lock()) state->round_done(kills_sent, sent, done);
  };
  s.submit_internal(std::move(op));
}

void RedisConnection::State::round_done(const std::vector<long long>& kills_sent,
                                        const std::vector<std::uint64_t>& sent, Op& op) {
  if (closing) return;
  if (op.failed) return;  // the session is gone; session_closed() tries again
  std::size_t i = 0;
  for (const long long id : kills_sent) {
    if (op.replies[i++].is_error()) kill_refused = true;  // NOPERM: undo without kills from now
    std::erase(kills, id);
  }
  std::vector<std::pair<Undo, Reply>> elsewhere;
  bool later = false;
  for (const std::uint64_t seq : sent) {
    const Reply& reply = op.replies[i++];
    auto it = std::find_if(undos.begin(), undos.end(), [&](const Kept& k) { return k.seq == seq; });
    if (it == undos.end()) continue;  // taken away meanwhile
    if (refused_for_now(reply)) {
      later = true;
      continue;
    }
    if (refused_elsewhere(reply) && refused) elsewhere.emplace_back(std::move(it->undo), reply);
    undos.erase(it);
  }
  backoff = std::chrono::milliseconds{0};
  if (!elsewhere.empty()) {
    asio::post(executor, [weak = weak_from_this(), elsewhere = std::move(elsewhere)]() mutable {
      auto state = weak.lock();
      if (!state || !state->refused) return;
      for (auto& [undo, reply] : elsewhere) state->refused(std::move(undo), reply);
    });
  }
  if (later) return retry_later();
  // Undos kept while this round was in flight go in the next one.
  asio::post(executor, [weak = weak_from_this()] {
    if (auto state = weak.lock()) state->recover();
  });
}

void RedisConnection::State::session_closed() {
  recover();
}

void RedisConnection::State::recover() {
  if (closing) return;
  if (undos.empty()) {
    kills.clear();
    backoff = std::chrono::milliseconds{0};
    return;
  }
  if (session && !session->closed()) {
    // A live session sends them once its handshake answered (or now, when it already did).
    if (session->ready()) on_ready(*session);
    return;
  }
  retry_later();
}

void RedisConnection::State::retry_later() {
  if (retry_armed || closing) return;
  retry_armed = true;
  retry.expires_after(backoff);
  backoff = std::min(std::max(backoff * 2, kRecoveryFirst), kRecoveryMax);
  retry.async_wait([weak = weak_from_this()](error_code) {
    auto state = weak.lock();
    if (!state) return;
    state->retry_armed = false;
    if (state->closing || state->undos.empty()) return;
    if (state->session && !state->session->closed()) {
      if (state->session->ready()) state->on_ready(*state->session);
      return;
    }
    state->open_session();  // its readiness sends them; its failure comes back here
  });
}

RedisConnection::RedisConnection(asio::any_io_executor executor, config::Redis options, Kind kind)
    : state_(std::make_shared<State>(std::move(executor), std::move(options), kind)) {}

RedisConnection::~RedisConnection() {
  state_->closing = true;
  state_->retry.cancel();
  if (state_->session) state_->session->close(store_errc::unavailable);
}

std::size_t RedisConnection::pending_undos() const noexcept {
  return state_->undos.size();
}

std::vector<Undo> RedisConnection::take_undos() {
  std::vector<Undo> out;
  out.reserve(state_->undos.size());
  for (auto& kept : state_->undos) out.push_back(std::move(kept.undo));
  state_->undos.clear();
  state_->kills.clear();
  return out;
}

void RedisConnection::adopt_undos(std::vector<Undo> undos) {
  if (undos.empty()) return;
  for (auto& undo : undos) state_->keep(std::move(undo), std::nullopt);
  state_->recover();
}

void RedisConnection::on_refused_undo(std::function<void(Undo, const Reply&)> handler) {
  state_->refused = std::move(handler);
}

const std::string& RedisConnection::address() const noexcept {
  return state_->options.address;
}

std::uint16_t RedisConnection::port() const noexcept {
  return state_->options.port;
}

std::uint64_t RedisConnection::connect_count() const noexcept {
  return state_->connects;
}

asio::awaitable<boost::system::result<std::vector<Reply>>> RedisConnection::execute(
    std::vector<Command> commands, Undo undo) {
  auto op = std::make_shared<Op>(state_->executor, std::move(commands), std::move(undo));
  if (op->commands.empty()) co_return std::vector<Reply>{};
  op->deadline.expires_after(state_->options.operation_timeout);
  // Every command is queued before this coroutine can yield: nothing gets between them.
  state_->live_session()->submit(op);
  if (!op->done) {
    auto [ec] = co_await op->deadline.async_wait(use_nothrow);
    if (!op->done && ec == asio::error::operation_aborted) {
      // The caller was cancelled: the commands stay in flight and their replies are dropped,
      // so the connection keeps its reply order and can be used further (an undo goes right
      // behind them once they answered).
      op->abandoned = true;
      co_return ec;
    }
  }
  if (!op->done) {
    auto where = op->session.lock();
    if (!op->sent || !where) {
      // Never sent (the handshake has not answered): nothing ran; the session's own handshake
      // deadline decides about the connection.
      op->fail(make_error_code(store_errc::timed_out));
      co_return make_error_code(store_errc::timed_out);
    }
    // Past the deadline: the connection may be dead or half-open, and replies are FIFO, so all
    // commands queued behind this one would wait for the missing reply too. It goes; the next
    // command opens a new one.
    where->close(store_errc::timed_out);
    co_return make_error_code(store_errc::timed_out);
  }
  if (op->failed) co_return *op->failed;
  co_return std::move(op->replies);
}

asio::awaitable<boost::system::result<Reply>> RedisConnection::execute(Command command) {
  std::vector<Command> one;
  one.push_back(std::move(command));
  auto replies = co_await execute(std::move(one));
  if (!replies) co_return replies.error();
  co_return std::move(replies->front());
}

}  // namespace idemgate::storage::redis
