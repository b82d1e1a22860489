#include "gateway/http/server.hpp"

#include <sys/socket.h>
#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>
#include <exception>
#include <stdexcept>
#include <thread>

#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/session.hpp"

namespace idemgate::http {

using common::log_json;
using common::use_nothrow;

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct Server::Worker {
  explicit Worker(unsigned i)
      : index(i),
        acceptor(io_context),
        drain_timer(io_context),
        accept_wake(io_context),
        context(std::make_shared<SessionContext>()) {
    context->header_deadlines = std::make_unique<HeaderDeadlines>(io_context.get_executor());
  }
  unsigned index;
  asio::io_context io_context{1};
  tcp::acceptor acceptor;
  asio::steady_timer drain_timer;
  /// A paused acceptor waits on it; cancelled when a connection closes (ConnectionGate) or the
  /// server stops.
  asio::steady_timer accept_wake;
  std::shared_ptr<SessionContext> context;
  /// This thread's copy of the configuration: its reference count is touched by this thread only.
  /// Replaced on the thread (posted by update_config).
  std::shared_ptr<const ProxyConfig> config;
  std::unique_ptr<RequestHandler> handler;
  std::atomic<std::thread::id> thread_id{};
  bool finished = false;
};

namespace {

using reuse_port = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;

tcp::endpoint resolve_listen(const Listen& listen) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(listen.address, ec);
  if (!ec) return {address, listen.port};
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(listen.address, std::to_string(listen.port));
  return results.begin()->endpoint();
}

void open_acceptor(tcp::acceptor& acceptor, const tcp::endpoint& endpoint) {
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.set_option(reuse_port(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  acceptor.non_blocking(true);  // accept_loop accepts only when a connection waits
}

constexpr auto kAcceptBackoffFirst = std::chrono::milliseconds(50);
constexpr auto kAcceptBackoffMax = std::chrono::milliseconds(1000);

/// ALPN (RFC 7301) on the server side: the first of our protocols (`arg`, wire format) that the
/// client offers; none in common, or no ALPN from the client: no protocol, which is HTTP/1.1.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                unsigned int inlen, void* arg) {
  const auto& ours = *static_cast<const std::string*>(arg);
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, reinterpret_cast<const unsigned char*>(ours.data()),
                            static_cast<unsigned int>(ours.size()), in,
                            inlen) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

std::unique_ptr<asio::ssl::context> make_tls_context(const Listen& listen,
                                                     const std::string& alpn_wire) {
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  tls->use_certificate_chain_file(listen.tls_cert);
  tls->use_private_key_file(listen.tls_key, asio::ssl::context::pem);
  SSL_CTX_set_alpn_select_cb(tls->native_handle(), &select_alpn,
                             const_cast<std::string*>(&alpn_wire));
  return tls;
}

}  // namespace

asio::awaitable<void> Server::accept_loop(Worker& worker) {
  ConnectionGate& gate = *gate_;
  const void* const id = &worker;
  // Runs on the thread that freed a slot: only posts to this worker's thread.
  const auto wake = [w = &worker] { asio::post(w->io_context, [w] { w->accept_wake.cancel(); }); };
  auto backoff = kAcceptBackoffFirst;
  while (worker.acceptor.is_open()) {
    // A slot is taken only once a connection waits in this thread's backlog: every thread
    // listens on a socket of its own (SO_REUSEPORT), and a slot held by an accept pending on an
    // empty one would leave a connection waiting in another thread's backlog below the limit.
    auto [ec] = co_await worker.acceptor.async_wait(tcp::acceptor::wait_read, use_nothrow);
    tcp::socket socket(worker.io_context);
    if (!ec) {
      if (!gate.try_take()) {
        // C52: at max_connections nothing is accepted; new connections wait in the backlog.
        gate.note_pause("max_connections");
        worker.accept_wake.expires_at(asio::steady_timer::time_point::max());
        if (!gate.take_or_park(id, wake)) {
          co_await worker.accept_wake.async_wait(use_nothrow);
          gate.unpark(id);
          continue;
        }
      }
      worker.acceptor.accept(socket, ec);  // non-blocking: the listener is
      if (ec) gate.give_back();
    }
    if (ec) {
      if (ec == asio::error::operation_aborted || !worker.acceptor.is_open()) break;
      // Gone before it was accepted (reset in the backlog): that connection only.
      if (ec == asio::error::would_block || ec == asio::error::try_again ||
          ec == asio::error::connection_aborted)
        continue;
      // Out of descriptors (EMFILE, ENFILE) or memory: retrying now would fail again and spin.
      // Wait for a connection to close, or for the backoff when what frees them is elsewhere.
      gate.note_pause(ec.message());
      worker.accept_wake.expires_after(backoff);
      gate.park(id, wake);
      co_await worker.accept_wake.async_wait(use_nothrow);
      gate.unpark(id);
      backoff = std::min(backoff * 2, kAcceptBackoffMax);
      continue;
    }
    backoff = kAcceptBackoffFirst;
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    start_session(std::move(socket), worker.context);  // the session owns the slot now
  }
  gate.unpark(id);
}

Server::Server(std::shared_ptr<const ProxyConfig> config, HandlerFactory make_handler,
               SessionObservers observers)
    : config_(std::move(config)),
      make_handler_(std::move(make_handler)),
      gate_(std::make_unique<ConnectionGate>(config_->limits.max_connections)) {
  if (!config_->listen.tls_cert.empty() || !config_->listen.tls_key.empty()) {
    for (const auto& protocol : config_->listen.tls_alpn) {
      alpn_wire_.push_back(static_cast<char>(protocol.size()));
      alpn_wire_ += protocol;
    }
    tls_ = make_tls_context(config_->listen, alpn_wire_);
  }
  const unsigned threads = static_cast<unsigned>(std::max(config_->threads, 1));
  auto endpoint = resolve_listen(config_->listen);
  for (unsigned i = 0; i < threads; ++i) {
    auto worker = std::make_unique<Worker>(i);
    open_acceptor(worker->acceptor, endpoint);
    if (i == 0) endpoint.port(worker->acceptor.local_endpoint().port());  // port 0 → the bound one
    worker->config = std::make_shared<const ProxyConfig>(*config_);
    worker->context->config = [w = worker.get()] { return w->config; };
    worker->context->tls = tls_.get();
    worker->context->observers = observers;
    worker->context->gate = gate_.get();
    worker->context->admission = &admission_;
    workers_.push_back(std::move(worker));
  }
  port_ = endpoint.port();
}

Server::~Server() {
  stop(false);
  for (auto& worker : workers_) {
    // Sessions destroyed with the io_context must not call back into a Worker being destroyed,
    // nor wake an acceptor whose io_context is gone.
    worker->context->on_session_end = nullptr;
    gate_->unpark(worker.get());
  }
}

std::shared_ptr<const ProxyConfig> Server::config() const {
  return std::atomic_load(&config_);
}

void Server::update_config(std::shared_ptr<const ProxyConfig> config) {
  // Each thread gets a copy of its own, copied here, off the io threads. A request that arrives
  // after this call is read after the post has run (the io_context runs handlers in order).
  for (auto& worker : workers_) {
    asio::post(worker->io_context, [w = worker.get(), fresh = std::make_shared<const ProxyConfig>(
                                                          *config)] { w->config = fresh; });
  }
  std::atomic_store(&config_, std::move(config));
}

bool Server::on_io_thread() const {
  const auto self = std::this_thread::get_id();
  for (const auto& worker : workers_) {
    if (worker->thread_id == self) return true;
  }
  return false;
}

void Server::run() {
  {
    std::lock_guard lock(mutex_);
    if (running_ || finished_ || stopping_) return;
    running_ = true;
  }
  const auto cfg = config();
  log_json(spdlog::level::info, "listening",
           {{"address", cfg->listen.address},
            {"port", port_},
            {"threads", workers_.size()},
            {"tls", tls_ != nullptr}});
  std::vector<std::thread> threads;
  threads.reserve(workers_.size());
  for (auto& worker : workers_) {
    threads.emplace_back([this, w = worker.get()] { run_worker(*w); });
  }
  for (auto& thread : threads) thread.join();
  {
    std::lock_guard lock(mutex_);
    running_ = false;
    finished_ = true;
  }
  stopped_cv_.notify_all();
}

void Server::run_worker(Worker& worker) {
  worker.thread_id = std::this_thread::get_id();
  try {
    worker.handler = make_handler_(worker.io_context, worker.index);
  } catch (const std::exception& e) {
    log_json(spdlog::level::err, "handler creation failed",
             {{"thread", worker.index}, {"error", e.what()}});
    stop(false);
  }
  worker.context->handler = worker.handler.get();
  worker.context->on_session_end = [this, &worker] {
    if (worker.context->draining && worker.context->sessions.empty()) finish_worker(worker);
  };
  asio::co_spawn(worker.io_context, accept_loop(worker),
                 common::log_on_exception("accept loop failed", spdlog::level::critical));
  worker.io_context.run();
  // Handlers are thread-affine (store connections): destroy it on its own thread, while the
  // io_context its sockets belong to still exists.
  worker.context->handler = nullptr;
  worker.handler.reset();
}

void Server::stop(bool drain) {
  if (!stopping_.exchange(true)) {
    for (auto& worker : workers_) {
      asio::post(worker->io_context, [this, w = worker.get(), drain] { begin_stop(*w, drain); });
    }
  }
  if (on_io_thread()) return;
  std::unique_lock lock(mutex_);
  stopped_cv_.wait(lock, [this] { return !running_; });
}

void Server::begin_stop(Worker& worker, bool drain) {
  boost::system::error_code ignored;
  worker.acceptor.close(ignored);
  worker.accept_wake.cancel();  // a paused acceptor ends too
  auto& context = *worker.context;
  context.draining = true;
  // A copy: closing a session may end it and remove it from the set.
  const std::vector<Session*> sessions(context.sessions.begin(), context.sessions.end());
  for (auto* session : sessions) {
    if (drain) {
      session->drain();
    } else {
      session->close();
    }
  }
  if (!drain || context.sessions.empty()) {
    finish_worker(worker);
    return;
  }
  worker.drain_timer.expires_after(worker.config->limits.drain_timeout);
  worker.drain_timer.async_wait([this, &worker](boost::system::error_code ec) {
    if (ec) return;
    if (!worker.context->sessions.empty()) {
      log_json(spdlog::level::warn, "drain timeout",
               {{"thread", worker.index}, {"open_connections", worker.context->sessions.size()}});
    }
    const std::vector<Session*> left(worker.context->sessions.begin(),
                                     worker.context->sessions.end());
    for (auto* session : left) session->close();
    finish_worker(worker);
  });
}

void Server::finish_worker(Worker& worker) {
  if (worker.finished) return;
  worker.finished = true;
  worker.drain_timer.cancel();
  // Answers already written may have left store work behind (a lock becoming its committed
  // marker): let it land, each step bounded by its store's operation_timeout.
  if (worker.handler) {
    worker.handler->when_background_done([&worker] { worker.io_context.stop(); });
    return;
  }
  worker.io_context.stop();
}

}  // namespace idemgate::http
