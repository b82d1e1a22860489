#pragma once
// Request bodies of the example payment service, parsed and validated without any I/O.

#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace idemgate::examples::payment {

/// Longest accepted id-like field (order_id, customer_id, provider, external_payment_id,
/// event_id, topic), in Unicode code points.
inline constexpr std::size_t kMaxIdLength = 200;

/// A validated `POST /payments` body.
struct PaymentRequest {
  std::string order_id;
  std::string customer_id;
  std::string provider;
  std::string external_payment_id;
  /// Decimal literal as received (no sign, no exponent, ≤ 15 integer and ≤ 4 fractional digits,
  /// > 0), passed to Postgres as text so numeric(19,4) stores it exactly; never a double.
  std::string amount;
};

/// A validated `POST /events` body (seed processed_event shape, R-DIST-IDEM-2).
struct EventRequest {
  std::string event_id;
  std::string topic;          ///< "http" when the body has none
  std::string consumer_name;  ///< "payment-service" when the body has none
};

/// Why a body was refused: the field it concerns ("" for the body as a whole) and one sentence
/// naming it, used as the problem+json `detail`.
struct FieldError {
  std::string field;
  std::string detail;
};

/// Parses a `POST /payments` body: a JSON object with the string members `order_id`,
/// `customer_id`, `provider`, `external_payment_id` (1…kMaxIdLength code points, no NUL) and
/// `amount` as a JSON string or number (see is_valid_amount). Unknown members are ignored;
/// a member given twice is an error. The amount keeps the literal text of a JSON number.
std::variant<PaymentRequest, FieldError> parse_payment_request(std::string_view body);

/// Parses a `POST /events` body: a JSON object with a string `event_id` and optional string
/// `topic` and `consumer_name`, each 1…kMaxIdLength code points.
std::variant<EventRequest, FieldError> parse_event_request(std::string_view body);

/// True when `text` is a positive decimal that numeric(19,4) holds exactly: digits with an
/// optional fraction of 1–4 digits, no sign, exponent, leading zeros or white space.
bool is_valid_amount(std::string_view text);

/// True when `text` is a positive decimal integer that fits a Postgres bigint.
std::optional<long long> parse_id(std::string_view text);

}  // namespace idemgate::examples::payment
