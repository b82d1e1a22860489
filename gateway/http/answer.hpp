#pragma once
// The answer to a routed, held request, whatever protocol brought it (HTTP/1.1 or an HTTP/2
// stream): the gateway's own refusals after routing, or the handler's answer (SPEC C01, C02,
// C53).

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string_view>

#include "gateway/http/admission.hpp"
#include "gateway/http/handler.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

/// Makes a request's fields what the upstream gets (C02): hop-by-hop fields and `Expect`
/// removed, the forwarding fields added with `client_ip` and `proto` (`http` or `https`): in
/// place to a field the request carries, else to `added` (add_forwarding_fields).
void prepare_forwarded(boost::beast::http::fields& fields, std::string_view client_ip,
                       std::string_view proto, AddedFields& added);

/// 503 `overloaded` with `Retry-After: 1` (SPEC C52, C53).
Response shed_response(std::string detail, unsigned version, bool keep_alive);
/// The detail of a 503 for a route at its `max_in_flight` (C53).
std::string route_full_detail(const Route& route);

/// When a request that began at `started` (steady clock) began on the wall clock, for its
/// access line (C32), and how long it has taken until now.
struct RequestTimes {
  std::chrono::system_clock::time_point started_wall;
  std::chrono::microseconds total;
};
RequestTimes times_of(std::chrono::steady_clock::time_point started);
/// Microseconds as the access line's milliseconds.
double to_ms(std::chrono::microseconds us);

/// A request whose header and body are read and checked, routed (or not) under `config`.
struct RoutedRequest {
  Request request;  ///< as the client sent it (fields are prepared here)
  std::shared_ptr<const ProxyConfig> config;
  const Route* route = nullptr;  ///< null: no route matched
  Admission::Ticket in_flight;   ///< the request's place in max_in_flight (C53)
  bool shed = false;             ///< the route was at max_in_flight
  std::string_view client_ip;
  std::string_view proto;                            ///< `http` or `https`, for X-Forwarded-Proto
  std::string_view request_id;                       ///< for the log line of a handler that failed
  std::size_t pass_through_hold = kHoldWhole;        ///< Exchange::pass_through_hold
  std::shared_ptr<RequestBodySource> body_source{};  ///< Exchange::body_source
  /// Lines the session added to the request already (its id), ahead of the forwarding fields.
  const AddedFields* added = nullptr;
};

/// An answer made without I/O, as an awaitable whose coroutine frame holds only that answer:
/// for the functions that return either it or a coroutine's awaitable.
boost::asio::awaitable<HandlerResult> answer_now(HandlerResult result);

/// What the gateway answers `in`: 503 when shed, 404 `route-not-found` when no route matched,
/// 500 when the route names an unknown upstream, otherwise the handler's answer to the request
/// with its fields prepared (prepare_forwarded; the added ones in Exchange::added, after
/// `in.added`'s lines) and framed by Content-Length. A handler that
/// throws is logged and answered 500 (outcome `internal_error`), and `keep_alive` becomes
/// false. `version` and `keep_alive` are those of the answer the client is to get.
boost::asio::awaitable<HandlerResult> answer_routed(RequestHandler& handler, RoutedRequest in,
                                                    unsigned version, bool& keep_alive);

}  // namespace idemgate::http
