#pragma once
// CORS for the routes that have `cors` (SPEC C57, the Fetch standard's "CORS protocol"): the
// handler answers preflights itself and sets the Access-Control-* fields on every response of
// such a route, the gateway's own answers and replays included. Pure functions on Beast fields.

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <string_view>

#include "gateway/config/config.hpp"

namespace idemgate {

/// True for a CORS preflight (Fetch §3.2.2): `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`. An OPTIONS without them is an ordinary request.
bool is_preflight(const boost::beast::http::request_header<>& request);

/// The answer to a preflight on `route` (which has `cors`): 204, never forwarded. When the
/// request's Origin is allowed it carries `Access-Control-Allow-Origin` (the origin, or `*` for
/// `allow_origins: ["*"]` without credentials), `-Allow-Credentials: true` with credentials,
/// `-Allow-Methods` (allow_methods and the idempotency methods), `-Allow-Headers` (allow_headers
/// and the key fields) and `-Max-Age` when configured; otherwise none of them, so the browser
/// stops. `Vary: Origin` is added unless every origin gets `*`. Version, Date and framing are
/// the session's.
boost::beast::http::response<boost::beast::http::string_body> preflight_response(
    const config::Route& route, const boost::beast::http::request_header<>& request);

/// On a route with `cors`: removes every `Access-Control-*` field of `response` (the gateway
/// answers for the route, an upstream's or a stored one's would contradict it), then, when
/// `origin` (the request's Origin, "" when none) is allowed, adds `Access-Control-Allow-Origin`,
/// `-Allow-Credentials` and `-Expose-Headers` (expose_headers plus Idempotent-Replayed,
/// Idempotent-Body-Omitted, Idempotency-Status and Retry-After), and `Vary: Origin` unless every
/// origin gets `*`. Not for preflight answers (preflight_response sets their fields). Without
/// `cors`: nothing changes (C57: pass-through).
void add_cors_fields(const config::Route& route, std::string_view origin,
                     boost::beast::http::response_header<>& response);

}  // namespace idemgate
