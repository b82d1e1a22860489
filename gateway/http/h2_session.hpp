#pragma once
// HTTP/2 to clients (SPEC C49, C50) over libnghttp2: each stream is one request through the same
// routing, handler and answer rules as an HTTP/1.1 request; upstreams stay HTTP/1.1.

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "gateway/http/byte_stream.hpp"

namespace idemgate::http {

struct SessionContext;

/// The client connection preface (RFC 9113 §3.4).
inline constexpr std::string_view kH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a cleartext connection say about it (SPEC C49, prior knowledge).
enum class PrefaceMatch {
  http1,  ///< not the HTTP/2 preface: the connection speaks HTTP/1.1
  h2,     ///< the whole preface: the connection speaks HTTP/2
  more,   ///< a proper beginning of the preface: more bytes decide
};
PrefaceMatch match_h2_preface(std::string_view first_bytes);

/// One HTTP/2 client connection, served on the io thread of its socket.
///
/// - SETTINGS: `MAX_CONCURRENT_STREAMS` = `limits.h2_max_concurrent_streams` (streams past it
///   are refused with REFUSED_STREAM by the codec), `MAX_HEADER_LIST_SIZE` =
///   `limits.max_header_bytes`. A decoded header list over `max_header_bytes` (counted as its
///   HTTP/1.1 lines would be) → 431 on that stream; a body over `max_request_body` → 413 (C04).
/// - RFC 9113 §8 messaging (pseudo-header fields, connection-specific fields, `TE` other than
///   `trailers`, a `content-length` that disagrees with the DATA) is checked by the codec: a
///   stream error PROTOCOL_ERROR; nothing reaches the handler.
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
