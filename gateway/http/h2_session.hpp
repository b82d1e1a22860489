#pragma once
// HTTP/2 to clients (SPEC C49, C50) over libnghttp2: each stream is one request through the same
// routing, handler and answer rules as an HTTP/1.1 request; upstreams stay HTTP/1.1.

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "gateway/http/byte_stream.hpp"
#include "gateway/http/h2_codec.hpp"

namespace idemgate::http {

struct SessionContext;

/// One HTTP/2 client connection, served on the io thread of its socket.
///
/// - The codec and the bounds of C51 are H2Codec's (gateway/http/h2_codec.hpp). A decoded
///   header list over `max_header_bytes` → 431 on that stream; a body over `max_request_body`
///   → 413 (C04).
/// - A stream's request, once whole, is routed and handled as RequestHandler::handle() an
///   HTTP/1.1 request; `:authority` serves as `Host`, `cookie` fields are joined with "; "
///   (RFC 9113 §8.2.3). A response body the handler did not hold (C39) follows as it arrives,
///   at most `limits.stream_buffer` bytes of it held (flow control is the backpressure).
/// - A stream the client resets ends its answer; the handler still runs to its end (C34).
/// - Timeouts: a connection without streams closes after `idle_timeout`; a write that makes no
///   progress for `idle_timeout` closes it.
/// - drain(): GOAWAY with the last stream id served; open streams run to their end.
/// - One access line per stream (C32) with `"protocol":"h2"`.
class H2Connection {
 public:
  /// Over `stream` (plain, or TLS after an ALPN `h2`); `proto` (`http`/`https`) goes to
  /// X-Forwarded-Proto.
  H2Connection(ByteStream stream, std::shared_ptr<SessionContext> context, std::string client_ip,
               std::string_view proto);
  ~H2Connection();
  H2Connection(const H2Connection&) = delete;
  H2Connection& operator=(const H2Connection&) = delete;

  /// Serves the connection whose first bytes (the preface at least) `buffer` holds, until it
  /// ends and every stream's handler has returned. Never throws for network errors.
  boost::asio::awaitable<void> run(boost::beast::flat_buffer& buffer);
  /// Server stop: GOAWAY now; open streams finish, then the connection closes.
  void drain();
  /// Closes the connection now; handlers in progress still run to their end.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace idemgate::http
