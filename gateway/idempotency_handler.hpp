#pragma once
// The Idempotency-Key contract on top of the HTTP shell (SPEC §4): reads the key from the route's
// key source, computes scope, record id and fingerprint, runs the core IdempotencyFilter against
// the thread's stores, and turns its decision into an HTTP response (replay, problem details).

#include <memory>

#include "gateway/config/config.hpp"
#include "gateway/core/idempotency_filter.hpp"
#include "gateway/core/lock_service.hpp"
#include "gateway/core/record_store.hpp"
#include "gateway/http/handler.hpp"

namespace idemgate {

/// Response fields the gateway owns (SPEC C16, C25, C29): stripped from client requests and from
/// upstream responses, set only by the gateway.
inline constexpr const char* kReplayedField = "Idempotent-Replayed";
inline constexpr const char* kBodyOmittedField = "Idempotent-Body-Omitted";
inline constexpr const char* kStatusField = "Idempotency-Status";

/// One per io thread; `forwarder`, `store` and `lock` belong to that thread and outlive this.
///
/// Routes with `idempotency.mode: off`, methods outside `idempotency.methods` (C11, C12) and
/// optional routes without a key are forwarded as they are (outcome `passthrough`). Otherwise:
/// missing key on a required route → 400 (C10), invalid key → 400 (C13), and the filter's
/// decisions: replay with `Idempotent-Replayed: true` (C16), mismatch → `on_mismatch` (C17),
/// in flight → 409 with Retry-After (C18), store failure → 503 with Retry-After or forwarded with
/// `Idempotency-Status: unprotected` (C25), upstream failure → 502/504 (C05, C21, C22), the
/// commit queue full → 503 `overloaded` with Retry-After, outcome `shed` (C54).
/// On a route with `cors`, a CORS preflight is answered here (204, C57) and never forwarded;
/// `OPTIONS` is never keyed.
/// The filter runs as its own coroutine, so a client that goes away does not cancel the upstream
/// call or the record write (C34). A response body longer than the route's `max_stored_response`
/// is not held: the record is committed without it, then the body goes to the client as it
/// arrives (HandlerResult::tail, C39).
class IdempotencyHandler final : public http::RequestHandler {
 public:
  /// `budget`: the process's commit queue bound (C54, shared by the threads); null: none.
  IdempotencyHandler(http::Forwarder& forwarder, core::RecordStore& store, core::LockService& lock,
                     core::FilterEvents events = {},
                     std::shared_ptr<core::CommitBudget> budget = nullptr);

  boost::asio::awaitable<http::HandlerResult> handle(http::Exchange exchange) override;

  /// True when the contract may apply (SPEC C38): a route with mode optional/required and a
  /// method in `methods`, unless the route is optional, its key comes from header fields and
  /// none of them is present. A key read from the body (json_pointer) needs the body.
  bool holds(const config::Route& route,
             const boost::beast::http::request_header<>& header) const override;
  /// Removes Idempotent-Replayed, Idempotent-Body-Omitted and Idempotency-Status (C16).
  void strip_owned_fields(boost::beast::http::fields& fields) const override;
  /// The route's CORS fields (C57, gateway/cors.hpp); nothing on a route without `cors`.
  void add_route_fields(const config::Route& route, std::string_view origin,
                        boost::beast::http::response_header<>& header) const override;
  /// Waits for the filter's lock settlements (marker or release, C23).
  void when_background_done(std::function<void()> done) override {
    filter_.when_settled(std::move(done));
  }

 private:
  boost::asio::awaitable<http::HandlerResult> pass_through(http::Exchange exchange,
                                                           const char* outcome);
  /// A keyed request and its route's policy, shared by handle() and the filter's run (C34).
  struct KeyedExchange {
    http::Exchange exchange;
    core::RoutePolicy policy;
  };
  /// The keyed part of handle(): the filter on its own coroutine (C34), then the answer.
  boost::asio::awaitable<http::HandlerResult> run_keyed(std::shared_ptr<KeyedExchange> shared,
                                                        core::KeyedRequest keyed,
                                                        std::string key_hash);

  http::Forwarder& forwarder_;
  core::IdempotencyFilter filter_;
};

/// The core's policy for a configured route.
core::RoutePolicy route_policy(const config::Idempotency& idempotency);

}  // namespace idemgate
