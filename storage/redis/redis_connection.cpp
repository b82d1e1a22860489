#include "storage/redis/redis_connection.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <deque>
#include <optional>

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using core::store_errc;

inline constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

}  // namespace

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

/// One command from issue to completion. The issuing coroutine sleeps on `deadline`; the reply
/// callback stores the outcome and cancels the timer, which only queues the coroutine on the
/// io_context (it never resumes it inside the hiredis callback).
struct CommandOp {
  CommandOp(asio::any_io_executor executor, std::vector<std::string> args)
      : deadline(std::move(executor)), argv(std::move(args)) {}

  void complete(boost::system::result<Reply> r) {
    if (outcome) return;
    outcome = std::move(r);
    deadline.cancel();
  }

  asio::steady_timer deadline;
  std::vector<std::string> argv;
  std::optional<boost::system::result<Reply>> outcome;
};

class RedisConnection::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::any_io_executor executor, const config::Redis& options)
      : options_(options), resolver_(executor), socket_(executor) {}

  ~Session() { close(store_errc::unavailable); }

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool closed() const noexcept { return closed_; }

  void start() {
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

  /// Sends `op` now, or after name resolution; completes it at once when the session is closed.
  void submit(std::shared_ptr<CommandOp> op) {
    if (closed_) return op->complete(make_error_code(reason_));
    if (!ac_) return waiting_.push_back(std::move(op));
    send(std::move(op));
  }

  /// Tears the connection down: everything in flight on it ends with `reason`. Safe to call from
  /// inside a reply callback (hiredis defers the free until the callback returns) and twice.
  void close(store_errc reason) {
    if (closed_) return;
    closed_ = true;
    reason_ = reason;
    resolver_.cancel();
    for (auto& op : waiting_) op->complete(make_error_code(reason_));
    waiting_.clear();
    // Runs every pending reply callback with a NULL reply, then the cleanup hook.
    if (ac_) redisAsyncFree(ac_);
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

    // Replies are FIFO: commands queued now go out after AUTH and SELECT once connected.
    if (!options_.password.empty()) {
      send_setup(options_.username.empty()
                     ? std::vector<std::string>{"AUTH", options_.password}
                     : std::vector<std::string>{"AUTH", options_.username, options_.password});
    }
    if (options_.db != 0) send_setup({"SELECT", std::to_string(options_.db)});
    while (!waiting_.empty() && !closed_) {
      auto op = std::move(waiting_.front());
      waiting_.pop_front();
      send(std::move(op));
    }
  }

  bool append(const std::vector<std::string>& argv, redisCallbackFn* fn, void* privdata) {
    std::vector<const char*> args;
    std::vector<std::size_t> lengths;
    args.reserve(argv.size());
    lengths.reserve(argv.size());
    for (const auto& a : argv) {
      args.push_back(a.data());
      lengths.push_back(a.size());
    }
    return redisAsyncCommandArgv(ac_, fn, privdata, static_cast<int>(args.size()), args.data(),
                                 lengths.data()) == REDIS_OK;
  }

  void send(std::shared_ptr<CommandOp> op) {
    // hiredis owns privdata until the callback runs, which it does exactly once (a NULL reply
    // when the context goes away).
    auto holder = std::make_unique<std::shared_ptr<CommandOp>>(op);
    if (append(op->argv, &Session::on_reply, holder.get())) {
      holder.release();
    } else {
      op->complete(make_error_code(store_errc::unavailable));
    }
  }

  void send_setup(std::vector<std::string> argv) {
    if (!append(argv, &Session::on_setup_reply, nullptr)) close(store_errc::unavailable);
  }

  static Session& of(const void* p) { return *static_cast<Session*>(const_cast<void*>(p)); }

  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
    std::unique_ptr<std::shared_ptr<CommandOp>> holder(
        static_cast<std::shared_ptr<CommandOp>*>(privdata));
    auto& op = **holder;
    if (reply == nullptr) return op.complete(make_error_code(of(ac->data).reason_));
    op.complete(copy_reply(*static_cast<const redisReply*>(reply)));
  }

  static void on_setup_reply(redisAsyncContext* ac, void* reply, void*) {
    auto* r = static_cast<const redisReply*>(reply);
    if (r != nullptr && r->type == REDIS_REPLY_ERROR) of(ac->data).close(store_errc::protocol);
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
    s.arm_write();
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
    if (s.socket_.is_open()) s.socket_.release();  // pending waits end with operation_aborted
  }

  void arm_read() {
    if (read_armed_ || ac_ == nullptr) return;
    read_armed_ = true;
    socket_.async_wait(asio::posix::stream_descriptor::wait_read,
                       [self = shared_from_this()](error_code ec) { self->on_readable(ec); });
  }

  void arm_write() {
    if (write_armed_ || ac_ == nullptr) return;
    write_armed_ = true;
    socket_.async_wait(asio::posix::stream_descriptor::wait_write,
                       [self = shared_from_this()](error_code ec) { self->on_writable(ec); });
  }

  // redisAsyncHandleRead/Write may free the context (EOF, connect refused): ac_ is re-checked
  // after each call because the cleanup hook resets it.
  void on_readable(error_code ec) {
    read_armed_ = false;
    if (ac_ == nullptr || ec == asio::error::operation_aborted) return;
    if (ec) return close(store_errc::unavailable);
    if (want_read_) redisAsyncHandleRead(ac_);
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
  asio::ip::tcp::resolver resolver_;
  asio::posix::stream_descriptor socket_;
  redisAsyncContext* ac_ = nullptr;
  std::deque<std::shared_ptr<CommandOp>> waiting_;  // issued while the name resolves
  bool closed_ = false;
  store_errc reason_ = store_errc::unavailable;  // what in-flight commands end with on close
  bool want_read_ = false;
  bool want_write_ = false;
  bool read_armed_ = false;
  bool write_armed_ = false;
};

RedisConnection::RedisConnection(asio::any_io_executor executor, config::Redis options)
    : executor_(std::move(executor)), options_(std::move(options)) {}

RedisConnection::~RedisConnection() {
  if (session_) session_->close(store_errc::unavailable);
}

std::shared_ptr<RedisConnection::Session> RedisConnection::session() {
  if (!session_ || session_->closed()) {
    session_ = std::make_shared<Session>(executor_, options_);
    ++connect_count_;
    session_->start();
  }
  return session_;
}

asio::awaitable<boost::system::result<Reply>> RedisConnection::execute(
    std::vector<std::string> argv) {
  return run(std::move(argv), false);
}

asio::awaitable<boost::system::result<Reply>> RedisConnection::execute_asking(
    std::vector<std::string> argv) {
  return run(std::move(argv), true);
}

asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> RedisConnection::execute_then(
    std::vector<std::string> argv, std::vector<std::string> then, bool asking) {
  auto op = std::make_shared<CommandOp>(executor_, std::move(argv));
  auto next = std::make_shared<CommandOp>(executor_, std::move(then));
  next->deadline.expires_after(options_.operation_timeout);
  auto session = this->session();
  // All are queued before this coroutine can yield, so no other command gets between them.
  if (asking)
    session->submit(std::make_shared<CommandOp>(executor_, std::vector<std::string>{"ASKING"}));
  session->submit(op);
  session->submit(next);
  if (!next->outcome) {
    auto [ec] = co_await next->deadline.async_wait(use_nothrow);
    if (!next->outcome && ec == asio::error::operation_aborted) co_return ec;
  }
  if (!next->outcome) {
    session->close(store_errc::timed_out);
    co_return make_error_code(store_errc::timed_out);
  }
  // Replies are FIFO: once the second has an outcome, the first has one too.
  if (!op->outcome) co_return make_error_code(store_errc::protocol);
  if (!*op->outcome) co_return op->outcome->error();
  if (!*next->outcome) co_return next->outcome->error();
  co_return std::pair<Reply, Reply>{std::move(**op->outcome), std::move(**next->outcome)};
}

asio::awaitable<boost::system::result<Reply>> RedisConnection::run(std::vector<std::string> argv,
                                                                   bool asking) {
  auto op = std::make_shared<CommandOp>(executor_, std::move(argv));
  op->deadline.expires_after(options_.operation_timeout);
  auto session = this->session();
  // Both are queued before this coroutine can yield, so no other command gets between them.
  if (asking)
    session->submit(std::make_shared<CommandOp>(executor_, std::vector<std::string>{"ASKING"}));
  session->submit(op);
  if (!op->outcome) {
    auto [ec] = co_await op->deadline.async_wait(use_nothrow);
    if (!op->outcome && ec == asio::error::operation_aborted) {
      // The caller was cancelled: the command stays in flight and its reply is dropped, so the
      // connection keeps its reply order and can be used further.
      co_return ec;
    }
  }
  if (!op->outcome) {
    // Past the deadline: the connection may be dead or half-open, and replies are FIFO, so all
    // commands queued behind this one would wait for the missing reply too. It goes; the next
    // command opens a new one.
    session->close(store_errc::timed_out);
    co_return make_error_code(store_errc::timed_out);
  }
  co_return std::move(*op->outcome);
}

}  // namespace idemgate::storage::redis
