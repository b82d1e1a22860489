#pragma once
// The streaming relay (SPEC C38) and the upgrade tunnel (SPEC C40): a request the handler does
// not hold (RequestHandler::holds) is passed to the upstream and its response back to the client as
// the bytes arrive, with at most `limits.stream_buffer` bytes held per direction, and a 101 to a
// WebSocket upgrade becomes a byte tunnel. The same exchange serves held answers (relay_held,
// UpstreamPool::forward): the response is read into a bounded body instead of written to a
// client.

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/http/byte_stream.hpp"
#include "gateway/http/handler.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/settings.hpp"
#include "gateway/http/upstream_pool.hpp"

namespace idemgate::common {
class DeadlineList;
}

namespace idemgate::http {

using StreamRequestParser = boost::beast::http::request_parser<boost::beast::http::buffer_body>;

/// One streamed exchange, as the session hands it over.
struct RelayRequest {
  explicit RelayRequest(ByteStream client_stream) : client(client_stream) {}
  ByteStream client;  ///< the client connection
  /// The session's read buffer: bytes of the request body (or, for a tunnel, of the new
  /// protocol) that arrived with the header are taken from it.
  boost::beast::flat_buffer* client_buffer = nullptr;
  /// The header is parsed, hop-by-hop fields are removed and forwarding fields added; the body
  /// is still to be read. Its body limit is `max_streamed_body` (body_limit → cut).
  StreamRequestParser* parser = nullptr;
  unsigned client_version = 11;
  bool client_keep_alive = true;  ///< the client's wish and the server's (not draining)
  bool head = false;
  /// The client asked to upgrade to WebSocket on a route that allows it (C40): the request goes
  /// out with `Connection: upgrade` and `Upgrade: websocket`, and a 101 opens a tunnel.
  bool websocket = false;
  /// Both point into the configuration snapshot the session holds until relay() returns.
  const Limits* limits = nullptr;
  const Upstream* upstream = nullptr;
  UpstreamPool* pool = nullptr;
  /// The io thread's deadline list (required): a request whose body is held whole is timed by
  /// an entry of it rather than by a timer of its own.
  common::DeadlineList* deadlines = nullptr;
  RequestHandler* handler = nullptr;  ///< strip_owned_fields, add_route_fields on the response
  /// The route and the request's Origin ("" when none), for add_route_fields; both point into
  /// what the session holds until relay() returns.
  const Route* route = nullptr;
  std::string_view origin;
  /// Called when a tunnel opens (true) and closes (false), for the open-tunnels gauge.
  std::function<void(bool)> tunnel_observer;
  /// Lines the session adds to the request (forwarding fields, a generated request id), in the
  /// same lifetime: rendered after the header's fields, or made fields of it where Beast's
  /// serializer writes the head. Null: none.
  const AddedFields* added = nullptr;
  /// The request's id ("" when none) and the field that carries it: set on the response header
  /// in place of any the upstream sent (conf/REFERENCE.md, "request_id"). Both point into what
  /// the session holds until relay() returns.
  std::string_view request_id_header;
  std::string_view request_id;
};

/// How a streamed exchange ended: what the session logs and counts.
struct RelayOutcome {
  /// When nothing was written to the client: the problem response to send (502/504, C05).
  std::optional<Response> problem;
  unsigned status = 0;      ///< the status written to the client (0 when `problem` is set)
  std::string outcome;      ///< passthrough, upstream_error or tunnel
  bool written = false;     ///< the response (or the tunnel's end) reached the client whole
  bool keep_alive = false;  ///< the client connection may carry the next request
  bool tunnel = false;      ///< a 101 was relayed and the tunnel has ended
  /// The client closed or reset its connection before the exchange ended (C48): the upstream
  /// connection was closed at once.
  bool client_closed = false;
  std::uint64_t bytes_in = 0;   ///< tunnel: bytes from the client to the upstream
  std::uint64_t bytes_out = 0;  ///< tunnel: bytes from the upstream to the client
  /// Time to the upstream's response header (connect, request, wait), zero when not reached.
  std::chrono::microseconds upstream_time{0};
  /// The error that ended reading the request body, if one did (a framing error of the client's
  /// body → the session answers 400 when nothing was written yet, C03).
  boost::system::error_code request_error;
  /// Why the exchange was cut after its response began (timeout, a side closed, the body limit);
  /// empty when it ended normally. The session logs it.
  std::string cut;
};

/// Relays one request and its response (SPEC C38) or tunnel (C40).
///
/// - A request body of known length up to `stream_buffer` is read first and may be sent twice:
///   on a pooled connection that the upstream closed before answering it is retried once on a
///   fresh connection (C08). A longer or chunked body is streamed on a fresh connection, piece
///   by piece (chunked to the upstream when it came chunked).
/// - Full duplex (C47): the response is read and relayed while the request body still goes up.
///   A response whose header arrives before the client's body has all arrived carries
///   `Connection: close`. A complete answer is relayed whatever the upstream does with the rest
///   of the request (reads it, stops reading, closes, resets): a failed write to the upstream
///   is no failure by itself. When the answer is complete before the whole request went out, the
///   rest is not read and both connections close after the answer.
/// - Client close (C48): once the request is out, the client's connection is read while the
///   response is awaited or streamed; EOF or a reset closes the upstream connection at once
///   (`client_closed`). Bytes that arrive instead (a pipelined request) stay in the buffer.
/// - Timeouts: each client read or write must progress within `limits.idle_timeout`, each
///   upstream read or write within the upstream's `idle_timeout`; the response header must
///   arrive within `request_timeout` of the request's end (else 504). A side that waits for the
///   other side's progress is not idle: only one read or write is pending per direction.
/// - The response keeps the upstream's Content-Length when it has one; otherwise it goes out
///   chunked to an HTTP/1.1 client and delimited by closing the connection to an HTTP/1.0 one
///   (C03). Hop-by-hop fields and the handler's owned fields are removed, Date set, Via added,
///   and the request id set (when the request has one).
/// - An upstream failure before the response header → `problem` (502 upstream-unreachable or
///   upstream-failed, 504 upstream-timeout). A `101` to a WebSocket request whose `Upgrade`
///   does not name `websocket` is such a failure (502, C40). Any failure after it → the client
///   connection is closed with the response visibly incomplete, and `cut` says why.
/// - A tunnel relays bytes both ways until a side closes, a read or write fails, or nothing
///   moved for `limits.tunnel_idle_timeout`; the client connection then closes.
/// Never throws for network errors.
/// `request` and `outcome` belong to the caller and must outlive the awaitable.
boost::asio::awaitable<void> relay(RelayRequest& request, RelayOutcome& outcome);

/// Writes a held answer, `header` as the session finalised it (its framing included) and `body`
/// whole: the head is rendered into a buffer of the thread's and goes out with the body in one
/// write; what the socket does not take at once follows piece by piece, each within
/// `limits.idle_timeout` (a slow but steady reader is not cut, C07). Returns the write's error.
boost::asio::awaitable<boost::system::error_code> write_response(
    ByteStream client, const boost::beast::http::response_header<>& header,
    boost::asio::const_buffer body, const Limits& limits);

/// UpstreamPool::forward() (its contract is there), run by the relay's exchange with the
/// answer held instead of written to a client: the request goes out whole, or from `body` as it
/// arrives, while the answer is read (C47); its body is held up to `hold_limit` bytes and
/// passed on past it (a ResponseTail, C39). Never throws for network errors.
boost::asio::awaitable<ForwardResult> relay_held(UpstreamPool& pool, const Upstream& upstream,
                                                 Request request, std::size_t hold_limit,
                                                 std::shared_ptr<RequestBodySource> body);

/// How sending a response with a ResponseTail ended.
struct TailOutcome {
  bool written = false;     ///< the whole response reached the client
  bool keep_alive = false;  ///< the client connection may carry the next request
  std::string cut;          ///< why it was cut, when it was
};

/// Sends a held request's answer whose body was left on the upstream connection (SPEC C39):
/// `header` as the session finalised it (end-to-end fields, Date, Via, ids, `Connection`), framed
/// here for the body still to come as relay() frames a streamed one, then the body bytes read
/// already and the rest as it arrives, each client write within `limits.idle_timeout` and each
/// upstream read within the upstream's `idle_timeout`. When the body ended cleanly the
/// upstream connection goes back to the pool; on a failure the client connection is closed with
/// the response visibly incomplete. Never throws for network errors.
boost::asio::awaitable<TailOutcome> send_tail(ByteStream client,
                                              const boost::beast::http::response_header<>& header,
                                              ResponseTail& tail, const Limits& limits);

/// The next bytes of `tail`'s body (SPEC C39) into [data, data + size) for a sender of its own
/// (an HTTP/2 stream): the bytes read already first, then one read from the upstream within its
/// `idle_timeout`. `got` is how many bytes were stored; `done` is set once the body has ended,
/// and the upstream connection then goes back to the pool. A failed read returns its error.
boost::asio::awaitable<boost::system::error_code> read_tail_piece(ResponseTail& tail, char* data,
                                                                  std::size_t size,
                                                                  std::size_t& got, bool& done);

}  // namespace idemgate::http
