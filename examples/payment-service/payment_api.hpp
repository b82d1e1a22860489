#pragma once
// The payment service's endpoints: routing, validation replies and JSON bodies.

#include <atomic>
#include <chrono>
#include <cstdint>

#include "examples/payment-service/http_server.hpp"
#include "examples/payment-service/payment_store.hpp"

namespace idemgate::examples::payment {

/// Executions since start, served by `GET /stats` so tests can prove exactly-once.
struct Stats {
  std::atomic<std::uint64_t> payment_posts{0};      ///< POST /payments handled, any outcome
  std::atomic<std::uint64_t> payments_inserted{0};  ///< rows actually inserted into `payment`
  std::atomic<std::uint64_t> refunds{0};            ///< POST /payments/{id}/refund handled
  std::atomic<std::uint64_t> refunds_applied{0};    ///< refunds that changed a payment
  std::atomic<std::uint64_t> events{0};             ///< POST /events handled, any outcome
  std::atomic<std::uint64_t> events_recorded{0};    ///< events new to `processed_event`
};

/// Handles requests for one connection.
///
/// | Method, target              | Answer                                                      |
/// |-----------------------------|-------------------------------------------------------------|
/// | POST /payments              | 201 + Location (new), 200 (same provider+external id), 400   |
/// | GET /payments/{id}          | 200, 404                                                    |
/// | POST /payments/{id}/refund  | 200 (refunded now), 409 (already refunded), 404             |
/// | POST /events                | 200 `{"status":"processed"|"duplicate"}`, 400               |
/// | GET /stats, GET /healthz    | 200                                                         |
/// Unknown paths get 404, known paths with another method 405 with `Allow`; errors are
/// application/problem+json; Postgres failures 503 with `Retry-After: 1`.
///
/// @par Thread Safety
/// One instance per connection thread; `stats` is shared and atomic.
class PaymentApi {
 public:
  /// `post_delay` is slept before the work of every POST (artificial upstream latency).
  PaymentApi(PaymentStore& store, Stats& stats, std::chrono::milliseconds post_delay);

  Response handle(const Request& request);

 private:
  Response create_payment(const Request& request);
  Response get_payment(long long id);
  Response refund_payment(long long id);
  Response record_event(const Request& request);
  Response stats() const;
  void delay() const;

  PaymentStore& store_;
  Stats& stats_;
  std::chrono::milliseconds post_delay_;
};

}  // namespace idemgate::examples::payment
