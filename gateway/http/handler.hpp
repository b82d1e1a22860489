#pragma once
// The seam between the HTTP shell (sessions, upstream pool) and what decides about a request.
// The session reads and validates a request, matches its route, strips hop-by-hop fields and
// adds X-Forwarded-*/Via (SPEC C02), then hands it to the thread's RequestHandler. The
// idempotency handler (gateway/idempotency_handler.hpp) wraps the plain forwarding one.

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "gateway/http/admission.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

/// The body of an upstream response that is not held but passed on (SPEC C39); defined in
/// gateway/http/upstream_pool.hpp.
struct ResponseTail;

/// What an upstream exchange ended with (SPEC C05, C08, C21, C22).
struct ForwardResult {
  enum class Kind {
    response,     ///< a complete response was read; `response` holds it (end-to-end fields only)
    not_reached,  ///< no byte of the request was written (connect refused/failed) → 502
    unknown_outcome,  ///< request written, then reset/EOF/malformed response → 502
    timed_out,        ///< request written, no complete response within request_timeout → 504
  };
  Kind kind = Kind::not_reached;
  Response response;
  /// Kind::response whose body passed the hold limit: `response` has the header only (no
  /// Content-Length) and the body is still to be read from here (SPEC C39).
  std::shared_ptr<ResponseTail> tail{};
  std::string detail;  ///< one sentence for logs and problem details when kind != response
  std::chrono::microseconds upstream_time{0};
};

/// A request body that follows the header as it arrives (an HTTP/2 upload on a pass-through
/// route, SPEC C50): the upstream gets it piece by piece, each piece read once it has gone out.
class RequestBodySource {
 public:
  virtual ~RequestBodySource() = default;
  /// The next piece into `piece` (its old contents replaced; empty with `done` at the end).
  /// An error: the client reset the stream or sent nothing for `idle_timeout`, or the body
  /// passed `max_streamed_body`; the upstream then gets no more.
  virtual boost::asio::awaitable<boost::system::error_code> next(std::string& piece,
                                                                 bool& done) = 0;
};

/// The request as the handler sees it, with the route already chosen.
struct Exchange {
  /// Hop-by-hop and the handler's owned fields removed, X-Forwarded-*/Via added, body decoded.
  Request request;
  std::shared_ptr<const ProxyConfig> config;  ///< the snapshot this request runs on
  const Route* route = nullptr;               ///< points into *config
  const Upstream* upstream = nullptr;         ///< points into *config
  /// The request's place in its route's max_in_flight (SPEC C53): held for as long as the
  /// exchange lives, the upstream call and record commit included.
  Admission::Ticket in_flight;
  /// The most of a pass-through answer's body held before the rest follows as it arrives
  /// (ForwardResult::tail, SPEC C38/C39): an HTTP/2 stream asks for `stream_buffer`, so that its
  /// answers are not held whole; kHoldWhole leaves it to the route.
  std::size_t pass_through_hold = std::numeric_limits<std::size_t>::max();
  /// Set when the body follows as it arrives (`request` then has no body): only a request the
  /// handler does not hold (holds() false) comes with one.
  std::shared_ptr<RequestBodySource> body_source{};
  /// The fields the gateway adds for the upstream (the request id, X-Forwarded-*, Via, SPEC
  /// C02/C32) as rendered lines: a request answered without the upstream (a replay, a
  /// conflict) never builds them as fields. forwardable() puts them into `request`.
  AddedFields added{};

  /// `request` with the gateway's added fields, as the upstream is to get it; call it before
  /// forwarding, or before reading a field the gateway may have added (added.has()).
  Request& forwardable() {
    added.insert_into(request.base());
    added.clear();
    return request;
  }
};

/// What the session writes back and logs (SPEC C32).
struct HandlerResult {
  Response response;     ///< the session adds Date/Via/framing; fields here are end-to-end
  std::string outcome;   ///< SPEC C31 outcome label: passthrough, executed, replayed, …
  std::string key_hash;  ///< hex of the record id, empty when no key was involved
  std::chrono::microseconds upstream_time{0};
  /// Set when the response's body is still on the upstream connection (SPEC C39): the session
  /// writes `response`'s header, framed for that body, then passes the body on as it arrives.
  std::shared_ptr<ResponseTail> tail{};
  /// The handler has set every field it owns on `response` (e.g. a CORS preflight answer):
  /// the session does not call RequestHandler::add_route_fields for it.
  bool route_fields_set = false;
};

/// A Forwarder::forward() hold limit under which every body is held whole (up to the upstream's
/// `max_response_body`).
inline constexpr std::size_t kHoldWhole = std::numeric_limits<std::size_t>::max();

/// Forwards requests to upstream servers over pooled keep-alive connections. One per io thread.
class Forwarder {
 public:
  virtual ~Forwarder() = default;
  /// Sends `request` to one of `upstream`'s servers and reads the response within the
  /// upstream's timeouts. A response body longer than `hold_limit` bytes is not read whole:
  /// the result carries its header and a ResponseTail (SPEC C39). Never throws for network
  /// errors; see ForwardResult::Kind. With `body`, the request's body comes from it as it
  /// arrives (Content-Length kept when the request has one, else chunked) on a fresh
  /// connection, never retried (C08).
  virtual boost::asio::awaitable<ForwardResult> forward(
      const Upstream& upstream, Request request, std::size_t hold_limit,
      std::shared_ptr<RequestBodySource> body = nullptr) = 0;
};

class UpstreamPool;

/// Decides what to answer for one routed request. One instance per io thread.
class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  virtual boost::asio::awaitable<HandlerResult> handle(Exchange exchange) = 0;

  /// Whether the handler needs the whole request in memory (body read and bounded by
  /// `max_request_body`) to decide; asked with the header as the client sent it. When false
  /// and streaming_pool() is set, the session streams the exchange itself (SPEC C38) and
  /// handle() is not called.
  virtual bool holds(const Route& /*route*/,
                     const boost::beast::http::request_header<>& /*header*/) const {
    return true;
  }

  /// The thread's upstream pool for streamed exchanges and tunnels (SPEC C38, C40); null: every
  /// request goes through handle().
  virtual UpstreamPool* streaming_pool() { return nullptr; }

  /// Removes the fields the handler owns (SPEC C16: they never come from a client or an upstream)
  /// from a header on its way through: every request before it is forwarded or handled, and every
  /// streamed upstream response. A held response (handle()) is the handler's own to clean.
  virtual void strip_owned_fields(boost::beast::http::fields& /*fields*/) const {}

  /// Adds the fields the handler puts on every response of `route` (SPEC C57: CORS), whatever
  /// produced it: handle(), a streamed or relayed upstream response, or the session's own
  /// answer to a request routed there. `origin` is the request's `Origin` value ("" when none).
  /// Called on the session's thread just before the response header is written.
  virtual void add_route_fields(const Route& /*route*/, std::string_view /*origin*/,
                                boost::beast::http::response_header<>& /*header*/) const {}

  /// Calls `done` (on this thread) once the store work the handler left running after its
  /// answers has ended, e.g. a lock turned into its committed marker (SPEC C23); the server
  /// calls it before a drained worker stops. Each such operation is bounded by its store's
  /// operation_timeout.
  virtual void when_background_done(std::function<void()> done) { done(); }
};

}  // namespace idemgate::http
