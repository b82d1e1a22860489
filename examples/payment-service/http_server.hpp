#pragma once
// A small blocking HTTP/1.1 server: an accept loop and one thread per connection. Enough for an
// example upstream; the gateway itself is asynchronous.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace idemgate::examples::payment {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

/// Serves HTTP/1.1 with keep-alive. Each connection runs on its own thread with its own handler
/// (made by the factory on that thread), so a handler may hold per-connection state such as a
/// database connection.
///
/// Every response gets Content-Length, and `Keep-Alive: timeout=N` while the connection stays
/// open; a connection idle for N seconds, or silent for N seconds in the middle of a request, is
/// closed. Bodies over 1 MiB get 413, malformed requests 400 (problem+json), then the connection
/// closes. One JSON log line is written per request.
///
/// @par Thread Safety
/// run() is called once; stop() may be called from any thread (not from a signal handler).
class HttpServer {
 public:
  using Handler = std::function<Response(const Request&)>;
  using HandlerFactory = std::function<Handler()>;

  /// Binds and listens on `endpoint` (port 0 picks a free port). Throws
  /// boost::system::system_error when the address cannot be bound.
  HttpServer(const boost::asio::ip::tcp::endpoint& endpoint, std::chrono::seconds keep_alive,
             HandlerFactory factory);

  /// The bound address, with the actual port.
  boost::asio::ip::tcp::endpoint local_endpoint() const;

  /// Accepts until stop(), then waits up to `drain` for open connections to finish their
  /// current request. Returns false when some were still busy after `drain`.
  bool run(std::chrono::milliseconds drain);

  /// Stops accepting and ends idle connections; a request in progress still gets its response
  /// (with `Connection: close`).
  void stop();

 private:
  void serve(boost::asio::ip::tcp::socket accepted, std::uint64_t id);
  void session(boost::asio::ip::tcp::socket& socket, std::uint64_t id);

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::chrono::seconds keep_alive_;
  HandlerFactory factory_;

  std::mutex mutex_;
  std::condition_variable drained_;
  std::map<std::uint64_t, int> connections_;  // id → native socket, for stop()
  bool stopping_ = false;
};

/// An application/problem+json response (RFC 9457) with `type`, `title`, `status`, `detail`.
Response problem(unsigned status, std::string_view type_slug, std::string_view title,
                 std::string_view detail);

}  // namespace idemgate::examples::payment
