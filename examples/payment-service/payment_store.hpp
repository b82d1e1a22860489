#pragma once
// The payment service's Postgres access: one blocking libpq connection, opened lazily and
// reopened after it breaks. Seed R-DIST-IDEM-4: the UNIQUE (provider, external_payment_id)
// constraint, not the caller, decides that a payment exists once.

#include <optional>
#include <string>
#include <variant>

#include "examples/payment-service/payment_request.hpp"

struct pg_conn;

namespace idemgate::examples::payment {

/// A row of `payment`, every column as Postgres prints it (amount as numeric text: "10.1234").
struct Payment {
  long long id = 0;
  std::string order_id;
  std::string customer_id;
  std::string provider;
  std::string external_payment_id;
  std::string amount;
  std::string status;      ///< "created" or "refunded"
  std::string created_at;  ///< UTC, ISO 8601 with microseconds
  std::optional<std::string> refunded_at;
};

/// Postgres could not be reached or refused the statement; `detail` is libpq's message.
struct StoreFailure {
  std::string detail;
};

template <class T>
using StoreResult = std::variant<T, StoreFailure>;

/// Creates the tables if absent. Serialised by a transaction-scoped advisory lock, so several
/// services starting at once on an empty database do not race on the catalog.
/// Throws std::runtime_error with libpq's message on failure (start-up only).
void ensure_schema(const std::string& dsn);

/// Blocking access to the payment tables over one connection.
/// @par Thread Safety
/// Not thread-safe: one instance per connection thread (libpq connections are not shareable).
class PaymentStore {
 public:
  /// Does not connect; the first call does. `dsn` is a libpq connection string or URI; a
  /// `connect_timeout` of 5 s applies unless the DSN sets one.
  explicit PaymentStore(std::string dsn);
  ~PaymentStore();
  PaymentStore(const PaymentStore&) = delete;
  PaymentStore& operator=(const PaymentStore&) = delete;

  struct Created {
    Payment payment;
    bool inserted = false;  ///< false: (provider, external_payment_id) existed; `payment` is it
  };
  /// Inserts the payment with status "created" (INSERT … ON CONFLICT DO NOTHING), or returns
  /// the existing row with the same (provider, external_payment_id). Never creates two rows.
  StoreResult<Created> create(const PaymentRequest& request);

  /// The payment with `id`, or nullopt.
  StoreResult<std::optional<Payment>> find(long long id);

  enum class RefundOutcome { refunded, already_refunded, not_found };
  struct Refund {
    RefundOutcome outcome = RefundOutcome::not_found;
    std::optional<Payment> payment;  ///< the row after the attempt, when it exists
  };
  /// Moves a "created" payment to "refunded" once.
  StoreResult<Refund> refund(long long id);

  /// Records the event in `processed_event` and, only when it is new, counts it in
  /// `event_tally`, both in one transaction (seed R-DIST-IDEM-2). Returns true when new.
  StoreResult<bool> record_event(const EventRequest& event);

 private:
  struct Rows;
  StoreResult<Rows> exec(const char* sql, std::initializer_list<const std::string*> params);
  std::optional<StoreFailure> connect();
  void disconnect();

  std::string dsn_;
  pg_conn* conn_ = nullptr;
};

}  // namespace idemgate::examples::payment
