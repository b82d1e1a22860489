#include "examples/payment-service/http_server.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/serialize.hpp>
#include <cerrno>
#include <exception>
#include <thread>

#include "examples/payment-service/json_log.hpp"

namespace idemgate::examples::payment {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::uint64_t kMaxBody = 1024 * 1024;

// A blocking socket whose reads give up after `timeout` of silence. Asio's blocking reads wait
// forever (SO_RCVTIMEO only makes them poll again), so wait with poll() first.
class TimedSocket {
 public:
  TimedSocket(tcp::socket& socket, std::chrono::milliseconds timeout)
      : socket_(socket), timeout_(timeout) {}

  template <class MutableBuffers>
  std::size_t read_some(const MutableBuffers& buffers, beast::error_code& ec) {
    pollfd pfd{socket_.native_handle(), POLLIN, 0};
    int ready = 0;
    do {
      ready = ::poll(&pfd, 1, static_cast<int>(timeout_.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) {
      ec = beast::error::timeout;
      return 0;
    }
    return socket_.read_some(buffers, ec);
  }
  template <class MutableBuffers>
  std::size_t read_some(const MutableBuffers& buffers) {
    beast::error_code ec;
    const std::size_t n = read_some(buffers, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }

 private:
  tcp::socket& socket_;
  std::chrono::milliseconds timeout_;
};

bool quiet_end(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == beast::error::timeout ||
         ec == http::error::partial_message;
}

}  // namespace

Response problem(unsigned status, std::string_view type_slug, std::string_view title,
                 std::string_view detail) {
  Response res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/problem+json");
  boost::json::object body{
      {"type", "https://payment-service.example/problems/" + std::string(type_slug)},
      {"title", title},
      {"status", status},
      {"detail", detail},
  };
  res.body() = boost::json::serialize(body);
  return res;
}

HttpServer::HttpServer(const tcp::endpoint& endpoint, std::chrono::seconds keep_alive,
                       HandlerFactory factory)
    : acceptor_(io_, endpoint), keep_alive_(keep_alive), factory_(std::move(factory)) {}

tcp::endpoint HttpServer::local_endpoint() const {
  return acceptor_.local_endpoint();
}

bool HttpServer::run(std::chrono::milliseconds drain) {
  std::uint64_t next_id = 0;
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = acceptor_.accept(ec);
    std::unique_lock lock(mutex_);
    if (stopping_) break;
    if (ec) {
      lock.unlock();
      log_json(spdlog::level::warn, "accept failed", {{"error", ec.message()}});
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
        // Out of descriptors: new connections wait in the backlog until some close.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    const std::uint64_t id = ++next_id;
    connections_.emplace(id, socket.native_handle());
    lock.unlock();
    try {
      std::thread(&HttpServer::serve, this, std::move(socket), id).detach();
    } catch (const std::system_error& e) {
      log_json(spdlog::level::err, "cannot start a connection thread", {{"error", e.what()}});
      std::lock_guard relock(mutex_);
      connections_.erase(id);
    }
  }
  std::unique_lock lock(mutex_);
  return drained_.wait_for(lock, drain, [this] { return connections_.empty(); });
}

void HttpServer::stop() {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  stopping_ = true;
  // shutdown() wakes a thread blocked in accept() or poll(); SHUT_RD lets a connection that is
  // mid-request still write its response.
  ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
  for (const auto& [id, fd] : connections_) ::shutdown(fd, SHUT_RD);
}

void HttpServer::serve(tcp::socket accepted, std::uint64_t id) {
  int fd = -1;
  {
    tcp::socket socket = std::move(accepted);
    session(socket, id);
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
    fd = socket.release(ignored);
  }
  // Everything that used the io_context is gone before run() can return, and the descriptor is
  // unregistered before close so stop() never shuts down a number reused elsewhere.
  std::lock_guard lock(mutex_);
  connections_.erase(id);
  if (fd >= 0) ::close(fd);
  if (connections_.empty()) drained_.notify_all();
}

void HttpServer::session(tcp::socket& socket, std::uint64_t id) {
  const std::string peer = [&] {
    beast::error_code ec;
    const auto ep = socket.remote_endpoint(ec);
    return ec ? std::string("?") : ep.address().to_string() + ':' + std::to_string(ep.port());
  }();
  Handler handler;
  try {
    handler = factory_();
  } catch (const std::exception& e) {
    log_json(spdlog::level::err, "cannot create a handler", {{"error", e.what()}});
  }

  TimedSocket stream(socket, keep_alive_);
  beast::flat_buffer buffer;
  bool open = handler != nullptr;
  while (open) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(kMaxBody);
    beast::error_code ec;
    http::read_header(stream, buffer, parser, ec);
    if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> go_on{http::status::continue_, 11};
      http::write(socket, go_on, ec);
    }
    if (!ec) http::read(stream, buffer, parser, ec);
    if (ec && (quiet_end(ec) || !parser.got_some())) break;

    const auto started = std::chrono::steady_clock::now();
    Response res;
    const Request& req = parser.get();
    if (ec == http::error::body_limit) {
      res = problem(413, "body-too-large", "Payload Too Large",
                    "The request body exceeds " + std::to_string(kMaxBody) + " bytes.");
      open = false;
    } else if (ec) {
      res = problem(400, "malformed-request", "Bad Request",
                    "The request is not valid HTTP/1.1: " + ec.message() + ".");
      open = false;
    } else {
      try {
        res = handler(req);
      } catch (const std::exception& e) {
        log_json(spdlog::level::err, "handler failed", {{"error", e.what()}});
        res = problem(500, "internal-error", "Internal Server Error", "The handler failed.");
      }
      open = req.keep_alive();
    }
    {
      std::lock_guard lock(mutex_);
      open = open && !stopping_;
    }
    res.version(req.version() == 10 ? 10 : 11);
    res.keep_alive(open);
    if (open) res.set(http::field::keep_alive, "timeout=" + std::to_string(keep_alive_.count()));
    res.prepare_payload();
    http::write(socket, res, ec);
    open = open && !ec;

    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - started);
    log_json(spdlog::level::info, "request",
             {{"connection", id},
              {"peer", peer},
              {"method", req.method_string()},
              {"target", req.target()},
              {"status", res.result_int()},
              {"total_us", micros.count()}});
  }
}

}  // namespace idemgate::examples::payment
