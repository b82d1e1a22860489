#pragma once
// RFC 9457 problem details: every error the gateway writes itself is `application/problem+json`
// with `type`, `title`, `status` and `detail` (SPEC C33). Each condition has a stable `type` URI
// under https://idemgate.dev/problems/ that clients may branch on.

#include <string>
#include <string_view>

#include "gateway/http/handler.hpp"

namespace idemgate::http {

/// The conditions the proxy answers itself. The idempotency contract's own problems are the
/// handler's (gateway/contract_problem.hpp).
enum class Problem {
  bad_request,  ///< 400 `bad-request`: unparseable request line or header section
  bad_framing,  ///< 400 `bad-framing`: CL with TE, conflicting CLs, TE without final chunked (C03)
  route_not_found,       ///< 404 `route-not-found` (C01)
  payload_too_large,     ///< 413 `payload-too-large`: body over max_request_body (C04)
  headers_too_large,     ///< 431 `headers-too-large`: header section over max_header_bytes (C04)
  internal_error,        ///< 500 `internal-error`: a bug; the connection closes
  upstream_unreachable,  ///< 502 `upstream-unreachable`: no upstream server accepted (C05, C21)
  upstream_failed,   ///< 502 `upstream-failed`: sent, then reset/EOF/malformed answer (C05, C22)
  upstream_timeout,  ///< 504 `upstream-timeout`: no response within request_timeout (C05)
  /// 503 `overloaded`: a limit of SPEC §7 was reached (the route's max_in_flight, max_tunnels,
  /// the Postgres commit queue); nothing was forwarded (C52–C54)
  overloaded,
};

/// The fixed parts of a problem: its `type` URI, `title` and default status.
struct ProblemInfo {
  std::string_view type;
  std::string_view title;
  unsigned status;
};

/// The type, title and default status of `problem`. Pure.
ProblemInfo describe(Problem problem);

/// A complete problem+json response with `problem`'s default status: fields `Content-Type:
/// application/problem+json`, `Cache-Control: no-store`, body {type,title,status,detail},
/// Content-Length set, keep-alive per `keep_alive`. Callers may add fields (e.g. `Retry-After`).
Response make_problem(Problem problem, std::string detail, unsigned version, bool keep_alive);

/// As above for any problem `info` describes, answered with `status` (e.g. a problem whose
/// status is configured).
Response make_problem(const ProblemInfo& info, unsigned status, std::string detail,
                      unsigned version, bool keep_alive);

}  // namespace idemgate::http
