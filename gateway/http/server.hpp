#pragma once
// The HTTP listener: N io threads, each with its own io_context, acceptor (SO_REUSEPORT on one
// port), RequestHandler, sessions and copy of the config snapshot; nothing is shared between
// threads on the request path (STYLE "Threads").

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "gateway/http/admission.hpp"
#include "gateway/http/connection_gate.hpp"
#include "gateway/http/handler.hpp"
#include "gateway/http/session.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

class Server {
 public:
  /// Creates the thread's handler; called once per io thread, on that thread, before it serves.
  using HandlerFactory = std::function<std::unique_ptr<RequestHandler>(
      boost::asio::io_context& io_context, unsigned thread_index)>;

  /// Binds `config->threads` acceptors (at least one) to `listen.address:listen.port` with
  /// SO_REUSEPORT; with port 0 the first binds an ephemeral port and the others join it.
  /// With `listen.tls_cert`/`tls_key` set, connections are TLS (TLS 1.2 or later; the PEM
  /// certificate chain and key are read here, once: a reload does not re-read them), offering
  /// `listen.tls.alpn` by ALPN (an `h2` connection is served as HTTP/2, SPEC C49).
  /// `observers` see every connection and answered request (metrics).
  ///
  /// Overload (SPEC C52): the threads' acceptors share `limits.max_connections` slots (0: no
  /// bound; the app derives the default from RLIMIT_NOFILE before); at the limit each stops
  /// accepting, so new connections wait in the listen backlog, until a connection closes. An
  /// accept that fails for lack of descriptors (EMFILE, ENFILE) or another resource pauses the
  /// acceptor until a connection closes or a backoff (50 ms doubling to 1 s) runs out; it never
  /// retries at once. Pauses are logged at most once a second with a count. The limit is read
  /// here, once: a reload does not change it.
  /// Throws boost::system::system_error when binding fails or the TLS files cannot be used.
  Server(std::shared_ptr<const ProxyConfig> config, HandlerFactory make_handler,
         SessionObservers observers = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Serves on all io threads and blocks until stop() has finished; logs a JSON `listening`
  /// line with the bound port first. Returns at once if stop() came first. Call once.
  void run();

  /// The bound port (useful with port 0). Thread-safe.
  std::uint16_t local_port() const { return port_; }

  /// Stops accepting. With `drain`, requests in progress finish (their responses carry
  /// `Connection: close`) for up to `limits.drain_timeout`, idle keep-alive connections close at
  /// once, and what remains after the timeout is closed; without it all connections close now.
  /// Then every thread's handler is destroyed on its thread and run() returns.
  /// Thread-safe; idempotent. Called from outside the server's io threads it blocks until run()
  /// has returned (SPEC §1 SIGTERM); from an io thread (e.g. a handler) it only initiates.
  void stop(bool drain = true);

  /// Makes `config` the snapshot of requests that start from now on (SPEC §1 SIGHUP): each io
  /// thread gets a copy of it, posted to the thread. Listener fields (address, port, threads) are
  /// not re-applied. Thread-safe.
  void update_config(std::shared_ptr<const ProxyConfig> config);

  /// The snapshot last given (to the constructor or update_config). Thread-safe; not for the
  /// request path (sessions read their thread's copy through SessionContext::config).
  std::shared_ptr<const ProxyConfig> config() const;

  /// The client connection slots and accept pauses (SPEC C52). Thread-safe.
  const ConnectionGate& gate() const { return *gate_; }
  /// Requests in progress per route and tunnels open (SPEC C52, C53). Thread-safe.
  const Admission& admission() const { return admission_; }

 private:
  struct Worker;
  boost::asio::awaitable<void> accept_loop(Worker& worker);
  void run_worker(Worker& worker);
  void begin_stop(Worker& worker, bool drain);
  void finish_worker(Worker& worker);
  bool on_io_thread() const;

  std::shared_ptr<const ProxyConfig> config_;  // std::atomic_load/store only
  HandlerFactory make_handler_;
  /// The ALPN protocol list of `listen.tls.alpn` in wire format, for the context's callback.
  std::string alpn_wire_;
  std::unique_ptr<boost::asio::ssl::context> tls_;
  // Before workers_: sessions destroyed with a worker give their slot and tickets back.
  std::unique_ptr<ConnectionGate> gate_;
  Admission admission_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::uint16_t port_ = 0;

  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable stopped_cv_;
  bool running_ = false;
  bool finished_ = false;
};

}  // namespace idemgate::http
