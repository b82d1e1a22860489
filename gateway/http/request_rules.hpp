#pragma once
// The rules a request head must pass before it is routed (SPEC §3: C03, C04; RFC 9112): what
// the session refuses itself, and with which problem. Pure, no I/O: the session, the fuzz targets
// and the unit tests share them.

#include <boost/beast/http/message.hpp>
#include <boost/system/error_code.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/http/problem.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

/// A request the gateway answers itself with a problem (SPEC C03, C04, C33); the connection
/// closes after the answer.
struct Rejection {
  Problem problem;
  std::string detail;  ///< the problem's `detail`: names the rule or the limit broken
};

/// Whether the header section at the start of `data` continues a field line on the next line
/// (obs-fold, RFC 9112 §5.2). Beast joins such lines with a space; the gateway refuses them with
/// 400 instead, so that no hop behind it can read a folded field (a folded Transfer-Encoding
/// above all) differently from the gateway (C03). Looks no further than the first empty line.
bool has_obs_fold(std::string_view data);

/// The rejection for `has_obs_fold` (400 bad-request).
Rejection obs_fold_rejection();

/// The rejection for an error of Beast's request parser (a header, framing or body error): 431
/// past max_header_bytes, 413 past max_request_body, 400 bad-framing for conflicting or invalid
/// Content-Length/Transfer-Encoding, 400 bad-request for any other parse error (C03, C04).
/// nullopt for errors of the connection itself (EOF, reset, timeout), which end it silently.
std::optional<Rejection> rejection_for(const boost::system::error_code& ec, const Limits& limits);

/// Checks a parsed HTTP/1.x request head and makes it routable:
/// - Transfer-Encoding must be `chunked` alone, on HTTP/1.1 (RFC 9112 §6.1, §6.3; C03): another
///   final coding leaves the length undeterminable, and a coding before chunked would reach the
///   upstream still coded;
/// - exactly one Host on HTTP/1.1, at most one on HTTP/1.0 (RFC 9112 §3.2);
/// - an absolute-form target becomes origin-form, its authority the Host (RFC 9112 §3.2.2), so
///   that routing and forwarding read one authority; `*` and origin-form are kept.
/// `chunked` is the parser's verdict on Transfer-Encoding (Beast's parser::chunked()).
/// Returns the rejection (400 bad-framing or bad-request), or nullopt when `header` may be routed.
std::optional<Rejection> check_request_head(boost::beast::http::request_header<>& header,
                                            bool chunked);

}  // namespace idemgate::http
