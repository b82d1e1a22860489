#include "gateway/http/problem.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

namespace idemgate::http {

ProblemInfo describe(Problem problem) {
  switch (problem) {
    case Problem::bad_request:
      return {"https://idemgate.dev/problems/bad-request", "Malformed request", 400};
    case Problem::bad_framing:
      return {"https://idemgate.dev/problems/bad-framing", "Ambiguous request framing", 400};
    case Problem::route_not_found:
      return {"https://idemgate.dev/problems/route-not-found", "No route matches the request", 404};
    case Problem::payload_too_large:
      return {"https://idemgate.dev/problems/payload-too-large", "Request body too large", 413};
    case Problem::headers_too_large:
      return {"https://idemgate.dev/problems/headers-too-large", "Request header section too large",
              431};
    case Problem::internal_error:
      return {"https://idemgate.dev/problems/internal-error", "Internal gateway error", 500};
    case Problem::upstream_unreachable:
      return {"https://idemgate.dev/problems/upstream-unreachable", "Upstream unreachable", 502};
    case Problem::upstream_failed:
      return {"https://idemgate.dev/problems/upstream-failed",
              "Upstream failed without a complete response", 502};
    case Problem::upstream_timeout:
      return {"https://idemgate.dev/problems/upstream-timeout", "Upstream timed out", 504};
    case Problem::overloaded:
      return {"https://idemgate.dev/problems/overloaded", "The gateway is shedding load", 503};
  }
  return {"https://idemgate.dev/problems/internal-error", "Internal gateway error", 500};
}

Response make_problem(Problem problem, std::string detail, unsigned version, bool keep_alive) {
  const ProblemInfo info = describe(problem);
  return make_problem(info, info.status, std::move(detail), version, keep_alive);
}

Response make_problem(const ProblemInfo& info, unsigned status, std::string detail,
                      unsigned version, bool keep_alive) {
  Response res{static_cast<boost::beast::http::status>(status), version};
  res.set(boost::beast::http::field::content_type, "application/problem+json");
  res.set(boost::beast::http::field::cache_control, "no-store");
  boost::json::object body;
  body["type"] = info.type;
  body["title"] = info.title;
  body["status"] = status;
  body["detail"] = std::move(detail);
  res.body() = boost::json::serialize(body);
  res.keep_alive(keep_alive);
  res.content_length(res.body().size());
  return res;
}

}  // namespace idemgate::http
