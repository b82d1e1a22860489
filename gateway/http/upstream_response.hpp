#pragma once
// The I/O-free rules for reading an upstream's response (SPEC C03, C08, C16): how the parser of
// each response is set up, what a response header means for the exchange, and how a complete
// response becomes the one the gateway forwards. UpstreamPool applies them around its reads;
// the upstream_response fuzz target applies them to arbitrary bytes.

#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <boost/system/error_code.hpp>

#include "gateway/http/handler.hpp"

namespace idemgate::http {

using ResponseParser = boost::beast::http::response_parser<boost::beast::http::string_body>;
/// A parser that hands the body over piece by piece into a caller's buffer (streamed responses,
/// SPEC C38, and keyed ones read up to their hold limit, C39).
using StreamResponseParser = boost::beast::http::response_parser<boost::beast::http::buffer_body>;

/// The largest response header section taken from an upstream (status line and fields).
inline constexpr std::uint32_t kMaxResponseHeaderBytes = 64 * 1024;

/// Sets up a fresh parser for the next response on a connection (interim or final): header
/// limit kMaxResponseHeaderBytes, body limit `max_body`, and no body at all after a HEAD
/// request (`head`), whatever Content-Length or Transfer-Encoding say; chunk extensions are
/// checked against RFC 9112 §7.1.1 (check_chunk_extensions: bad_chunk_extension).
void prepare_response_parser(ResponseParser& parser, bool head, std::size_t max_body);
/// The same for a piecewise parser, without a body limit: the caller counts what it holds.
void prepare_response_parser(StreamResponseParser& parser, bool head);

/// Whether a read or write error means the upstream closed the connection (EOF, reset, broken
/// pipe, aborted): before the first response byte, a pooled connection that went stale (C08).
bool closed_before_answer(const boost::system::error_code& ec);

/// What a complete response header means for the exchange.
enum class ResponseHeaderVerdict {
  final_response,  ///< status 200 or above: read its body, it is the answer
  interim,         ///< 1xx other than 101: dropped; the next response follows on the connection
  refused,         ///< 101: the upstream switched protocols without being asked → failure
  /// 000-099, which the parser reads as three digits but no status is (RFC 9110 §15): the
  /// message's framing is unknown (it may have a body), so the connection fails.
  bad_status,
};
ResponseHeaderVerdict classify_response_header(unsigned status);

/// Why the gateway cannot read the body of a final response whose header is `header`, or "" when
/// it can: a `Transfer-Encoding` other than exactly `chunked` (any case, OWS around it) in one
/// field (`gzip, chunked`, `gzip`, `chunked ;, gzip`, two fields). Relaying such a body decoded
/// from chunked only would hand the client coded bytes it has no sign of (RFC 9112 §6.1); nginx
/// too answers 502 to it. Only asked of responses that have a body (not HEAD, 204, 304). Pure.
std::string unsupported_transfer_coding(const boost::beast::http::response_header<>& header);

/// A final response, read in full, as it is forwarded.
struct UpstreamResponse {
  Response response;  ///< end-to-end fields only, HTTP/1.1, framed by Content-Length
  /// The connection may carry the next request: the upstream keeps it alive, the body did not
  /// run to EOF, and no bytes arrived past the response.
  bool reusable = false;
  std::optional<std::chrono::seconds> keep_alive;  ///< the upstream's Keep-Alive: timeout=N
};

/// Builds the forwarded response once `parser` is done. `header` is the final response's header
/// as it was when the header was read (trailer fields, which the parser merges into its fields,
/// are dropped that way); `buffered` is how many bytes past the response were already read.
/// Hop-by-hop fields are removed; unless `head`, Content-Length is the
/// decoded body size, or absent for statuses without a body. Moves the body out of `parser`.
UpstreamResponse finish_upstream_response(ResponseParser& parser,
                                          boost::beast::http::response_header<> header, bool head,
                                          std::size_t buffered);
/// The same for a body read piece by piece into `body` through a piecewise parser.
UpstreamResponse finish_upstream_response(const StreamResponseParser& parser,
                                          boost::beast::http::response_header<> header,
                                          std::string body, bool head, std::size_t buffered);

}  // namespace idemgate::http
