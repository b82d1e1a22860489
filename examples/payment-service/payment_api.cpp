#include "examples/payment-service/payment_api.hpp"

#include <boost/beast/http/field.hpp>
#include <boost/json/serialize.hpp>
#include <thread>

#include "examples/payment-service/json_log.hpp"

namespace idemgate::examples::payment {
namespace {

namespace http = boost::beast::http;

Response json_response(http::status status, const boost::json::object& body) {
  Response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = boost::json::serialize(body);
  return res;
}

boost::json::object to_json(const Payment& p) {
  boost::json::object o{
      {"id", p.id},
      {"order_id", p.order_id},
      {"customer_id", p.customer_id},
      {"provider", p.provider},
      {"external_payment_id", p.external_payment_id},
      {"amount", p.amount},
      {"status", p.status},
      {"created_at", p.created_at},
  };
  o["refunded_at"] = p.refunded_at ? boost::json::value(*p.refunded_at) : nullptr;
  return o;
}

Response unavailable(const StoreFailure& failure) {
  log_json(spdlog::level::warn, "postgres failed", {{"error", failure.detail}});
  Response res = problem(503, "store-unavailable", "Service Unavailable",
                         "The payment database failed: " + failure.detail);
  res.set(http::field::retry_after, "1");
  return res;
}

Response invalid(const FieldError& error) {
  Response res = problem(400, "invalid-request", "Invalid request body", error.detail);
  return res;
}

Response method_not_allowed(std::string_view allow) {
  Response res = problem(405, "method-not-allowed", "Method Not Allowed",
                         "This resource accepts " + std::string(allow) + " only.");
  res.set(http::field::allow, allow);
  return res;
}

}  // namespace

PaymentApi::PaymentApi(PaymentStore& store, Stats& stats, std::chrono::milliseconds post_delay)
    : store_(store), stats_(stats), post_delay_(post_delay) {}

void PaymentApi::delay() const {
  if (post_delay_.count() > 0) std::this_thread::sleep_for(post_delay_);
}

Response PaymentApi::handle(const Request& req) {
  std::string_view path = req.target();
  path = path.substr(0, path.find('?'));
  const http::verb method = req.method();

  if (path == "/healthz") {
    if (method != http::verb::get) return method_not_allowed("GET");
    return json_response(http::status::ok, {{"status", "ok"}});
  }
  if (path == "/stats") {
    if (method != http::verb::get) return method_not_allowed("GET");
    return stats();
  }
  if (path == "/payments") {
    if (method != http::verb::post) return method_not_allowed("POST");
    return create_payment(req);
  }
  if (path == "/events") {
    if (method != http::verb::post) return method_not_allowed("POST");
    return record_event(req);
  }
  constexpr std::string_view kPrefix = "/payments/";
  constexpr std::string_view kRefund = "/refund";
  if (path.starts_with(kPrefix)) {
    std::string_view rest = path.substr(kPrefix.size());
    const bool refund = rest.ends_with(kRefund);
    if (refund) rest.remove_suffix(kRefund.size());
    if (rest.find('/') == std::string_view::npos) {
      const std::optional<long long> id = parse_id(rest);
      if (refund) {
        if (method != http::verb::post) return method_not_allowed("POST");
        if (id) return refund_payment(*id);
        ++stats_.refunds;
      } else {
        if (method != http::verb::get) return method_not_allowed("GET");
        if (id) return get_payment(*id);
      }
      return problem(404, "payment-not-found", "Not Found",
                     "No payment has the id '" + std::string(rest) + "'.");
    }
  }
  return problem(404, "not-found", "Not Found",
                 "There is no resource at '" + std::string(path) + "'.");
}

Response PaymentApi::create_payment(const Request& req) {
  ++stats_.payment_posts;
  delay();
  auto parsed = parse_payment_request(req.body());
  if (auto* error = std::get_if<FieldError>(&parsed)) return invalid(*error);

  auto created = store_.create(std::get<PaymentRequest>(parsed));
  if (auto* failure = std::get_if<StoreFailure>(&created)) return unavailable(*failure);
  const auto& [payment, inserted] = std::get<PaymentStore::Created>(created);
  if (!inserted) return json_response(http::status::ok, to_json(payment));

  ++stats_.payments_inserted;
  Response res = json_response(http::status::created, to_json(payment));
  res.set(http::field::location, "/payments/" + std::to_string(payment.id));
  return res;
}

Response PaymentApi::get_payment(long long id) {
  auto found = store_.find(id);
  if (auto* failure = std::get_if<StoreFailure>(&found)) return unavailable(*failure);
  const auto& payment = std::get<std::optional<Payment>>(found);
  if (!payment)
    return problem(404, "payment-not-found", "Not Found",
                   "No payment has the id '" + std::to_string(id) + "'.");
  return json_response(http::status::ok, to_json(*payment));
}

Response PaymentApi::refund_payment(long long id) {
  ++stats_.refunds;
  delay();
  auto refunded = store_.refund(id);
  if (auto* failure = std::get_if<StoreFailure>(&refunded)) return unavailable(*failure);
  const auto& [outcome, payment] = std::get<PaymentStore::Refund>(refunded);
  switch (outcome) {
    case PaymentStore::RefundOutcome::refunded:
      ++stats_.refunds_applied;
      return json_response(http::status::ok, to_json(*payment));
    case PaymentStore::RefundOutcome::already_refunded:
      return problem(409, "already-refunded", "Conflict",
                     "The payment '" + std::to_string(id) + "' was refunded at " +
                         payment->refunded_at.value_or("?") + ".");
    case PaymentStore::RefundOutcome::not_found:
      break;
  }
  return problem(404, "payment-not-found", "Not Found",
                 "No payment has the id '" + std::to_string(id) + "'.");
}

Response PaymentApi::record_event(const Request& req) {
  ++stats_.events;
  delay();
  auto parsed = parse_event_request(req.body());
  if (auto* error = std::get_if<FieldError>(&parsed)) return invalid(*error);
  const auto& event = std::get<EventRequest>(parsed);

  auto recorded = store_.record_event(event);
  if (auto* failure = std::get_if<StoreFailure>(&recorded)) return unavailable(*failure);
  const bool first = std::get<bool>(recorded);
  if (first) ++stats_.events_recorded;
  return json_response(http::status::ok, {{"event_id", event.event_id},
                                          {"status", first ? "processed" : "duplicate"}});
}

Response PaymentApi::stats() const {
  return json_response(http::status::ok, {
                                             {"payment_posts", stats_.payment_posts.load()},
                                             {"payments_inserted", stats_.payments_inserted.load()},
                                             {"refunds", stats_.refunds.load()},
                                             {"refunds_applied", stats_.refunds_applied.load()},
                                             {"events", stats_.events.load()},
                                             {"events_recorded", stats_.events_recorded.load()},
                                         });
}

}  // namespace idemgate::examples::payment
