#pragma once
// A small blocking HTTP/1.1 client for end-to-end tests: one request per fresh connection, or
// many over one kept-alive connection, with every response field kept in order.

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::test {

/// Header fields in wire order, repeated names kept.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

/// A request to send. `Host` is added (host:port) unless given; `Content-Length` is added for a
/// non-empty body, or for POST/PUT/PATCH, unless a framing field is given. Nothing else is
/// added, so tests control every other field.
struct HttpRequest {
  std::string method = "GET";
  std::string target = "/";
  HeaderList headers;
  std::string body;
  unsigned version = 11;  ///< 11 for HTTP/1.1, 10 for HTTP/1.0
};

/// A complete response.
struct HttpResponse {
  unsigned status = 0;
  unsigned version = 11;
  HeaderList headers;       ///< all fields, in the order received
  std::string body;         ///< after transfer decoding
  bool keep_alive = false;  ///< the response leaves the connection open (RFC 9112 §9.3)

  /// The first field named `name` (case-insensitive), or nullopt.
  std::optional<std::string> header(std::string_view name) const;
  /// Every value of fields named `name`, in order.
  std::vector<std::string> header_values(std::string_view name) const;
  /// How many fields are named `name`.
  std::size_t header_count(std::string_view name) const;
};

/// One client connection, opened by the constructor and reused for every request until the
/// server closes it or close() is called. Each operation (connect, write, read) must finish
/// within `timeout`, else it throws boost::system::system_error with beast::error::timeout and
/// the connection is closed. I/O errors throw boost::system::system_error.
///
/// @par Thread Safety
/// One thread at a time; use one connection per thread for concurrent requests.
class HttpConnection {
 public:
  /// Connects to `host:port` (an IP address). Throws boost::system::system_error.
  HttpConnection(std::string host, std::uint16_t port,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// Writes `request` and reads its response. A response read after a HEAD request has no body.
  HttpResponse request(const HttpRequest& request);

  /// Writes `request` without reading its response; pair with read_response() (e.g. to look
  /// at the connection while the server still works on the request).
  void send(const HttpRequest& request);

  /// Writes raw bytes as they are (for framing tests); pair with read_response().
  void send_raw(std::string_view bytes);

  /// Reads one response. `head`: the request was HEAD, so no body follows.
  HttpResponse read_response(bool head = false);

  /// Whether anything from the server (a byte, or the end of the connection) can be read
  /// within `wait`; nothing is consumed. A check that nothing arrived yet, not a measurement.
  bool readable_within(std::chrono::milliseconds wait);

  /// Waits up to the timeout for the server to close the connection without sending anything.
  /// Returns true on EOF or reset; false when the timeout passed or bytes arrived instead.
  bool wait_closed_by_peer();

  /// Whether the socket is open (false after close(), an error, or a response without
  /// keep-alive).
  bool is_open() const;

  /// Closes the connection; idempotent.
  void close();

  /// The local port of the connection (e.g. to match server logs).
  std::uint16_t local_port() const;

 private:
  template <class Op>
  void run(Op op);

  std::string host_;
  std::uint16_t port_;
  std::chrono::milliseconds timeout_;
  boost::asio::io_context io_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
};

/// Sends one request over a fresh connection and closes it. Throws like HttpConnection.
HttpResponse http_request(const std::string& host, std::uint16_t port, const HttpRequest& request,
                          std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace idemgate::test
