#include "examples/payment-service/payment_store.hpp"

#include <libpq-fe.h>

#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "examples/payment-service/json_log.hpp"

namespace idemgate::examples::payment {
namespace {

constexpr const char* kColumns =
    "id, order_id, customer_id, provider, external_payment_id, amount::text, status, "
    "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
    "to_char(refunded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

/// The parts, one after the other (appended: GCC 12 reports std::string's operator+ on a
/// temporary as out of bounds, PR 105651).
std::string concat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (const std::string_view part : parts) out.append(part);
  return out;
}

// The statements, built once.
const std::string kInsert =
    concat({"INSERT INTO payment (order_id, customer_id, provider, external_payment_id, "
            "amount, status) VALUES ($1, $2, $3, $4, $5::numeric, 'created') "
            "ON CONFLICT (provider, external_payment_id) DO NOTHING RETURNING ",
            kColumns});
const std::string kSelectByReference =
    concat({"SELECT ", kColumns, " FROM payment WHERE provider = $1 AND external_payment_id = $2"});
const std::string kSelectById = concat({"SELECT ", kColumns, " FROM payment WHERE id = $1"});
const std::string kRefund =
    concat({"UPDATE payment SET status = 'refunded', refunded_at = now() "
            "WHERE id = $1 AND status = 'created' RETURNING ",
            kColumns});

// Any constant works; it only has to be the same in every instance of the service.
constexpr const char* kSchemaLockKey = "7310012460319417344";

// client_min_messages: the "already exists, skipping" notices of every start are noise.
const std::string kSchema = concat({"SET client_min_messages = warning; BEGIN;",
                                    "SELECT pg_advisory_xact_lock(", kSchemaLockKey, ");",
                                    R"sql(
CREATE TABLE IF NOT EXISTS payment (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id            text          NOT NULL,
    customer_id         text          NOT NULL,
    provider            text          NOT NULL,
    external_payment_id text          NOT NULL,
    amount              numeric(19,4) NOT NULL CHECK (amount > 0),
    status              text          NOT NULL CHECK (status IN ('created', 'refunded')),
    created_at          timestamptz   NOT NULL DEFAULT now(),
    refunded_at         timestamptz,
    UNIQUE (provider, external_payment_id)
);
CREATE TABLE IF NOT EXISTS processed_event (
    event_id      text        PRIMARY KEY,
    topic         text        NOT NULL,
    consumer_name text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_processed_event_expires_at ON processed_event (expires_at);
CREATE TABLE IF NOT EXISTS event_tally (
    topic      text   PRIMARY KEY,
    deliveries bigint NOT NULL
);
COMMIT;)sql"});

// libpq prints notices (e.g. "relation already exists, skipping") to stderr by itself;
// route them through the JSON log instead.
void on_notice(void*, const char* message) {
  std::string text = message ? message : "";
  while (!text.empty() && text.back() == '\n') text.pop_back();
  log_json(spdlog::level::info, "postgres notice", {{"notice", text}});
}

pg_conn* open_connection(const std::string& dsn) {
  const char* keys[] = {"connect_timeout", "application_name", "dbname", nullptr};
  const char* values[] = {"5", "payment-service", dsn.c_str(), nullptr};
  pg_conn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn) PQsetNoticeProcessor(conn, on_notice, nullptr);
  return conn;
}

std::string message_of(const pg_conn* conn) {
  std::string text = conn ? PQerrorMessage(conn) : "out of memory";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

struct PaymentStore::Rows {
  std::unique_ptr<PGresult, decltype(&PQclear)> result{nullptr, &PQclear};

  int size() const { return PQntuples(result.get()); }
  std::string text(int row, int col) const {
    return std::string(PQgetvalue(result.get(), row, col),
                       static_cast<std::size_t>(PQgetlength(result.get(), row, col)));
  }
  bool is_null(int row, int col) const { return PQgetisnull(result.get(), row, col) != 0; }
  Payment payment(int row) const {
    Payment p;
    p.id = std::stoll(text(row, 0));
    p.order_id = text(row, 1);
    p.customer_id = text(row, 2);
    p.provider = text(row, 3);
    p.external_payment_id = text(row, 4);
    p.amount = text(row, 5);
    p.status = text(row, 6);
    p.created_at = text(row, 7);
    if (!is_null(row, 8)) p.refunded_at = text(row, 8);
    return p;
  }
};

void ensure_schema(const std::string& dsn) {
  std::unique_ptr<pg_conn, decltype(&PQfinish)> conn{open_connection(dsn), &PQfinish};
  if (!conn || PQstatus(conn.get()) != CONNECTION_OK)
    throw std::runtime_error("cannot connect to Postgres: " + message_of(conn.get()));
  std::unique_ptr<PGresult, decltype(&PQclear)> result{PQexec(conn.get(), kSchema.c_str()),
                                                       &PQclear};
  if (PQresultStatus(result.get()) != PGRES_COMMAND_OK)
    throw std::runtime_error("cannot create the schema: " + message_of(conn.get()));
}

PaymentStore::PaymentStore(std::string dsn) : dsn_(std::move(dsn)) {}

PaymentStore::~PaymentStore() {
  disconnect();
}

void PaymentStore::disconnect() {
  if (conn_) PQfinish(conn_);
  conn_ = nullptr;
}

std::optional<StoreFailure> PaymentStore::connect() {
  if (conn_ && PQstatus(conn_) == CONNECTION_OK) return std::nullopt;
  disconnect();
  conn_ = open_connection(dsn_);
  if (conn_ && PQstatus(conn_) == CONNECTION_OK) return std::nullopt;
  StoreFailure failure{"cannot connect to Postgres: " + message_of(conn_)};
  disconnect();
  return failure;
}

StoreResult<PaymentStore::Rows> PaymentStore::exec(
    const char* sql, std::initializer_list<const std::string*> params) {
  if (auto failure = connect()) return *failure;
  std::vector<const char*> values;
  for (const std::string* p : params) values.push_back(p->c_str());
  Rows rows;
  rows.result.reset(PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr,
                                 values.data(), nullptr, nullptr, 0));
  const ExecStatusType status = PQresultStatus(rows.result.get());
  if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) return rows;
  StoreFailure failure{message_of(conn_)};
  // A broken connection is not reused; the next call opens a fresh one.
  if (PQstatus(conn_) != CONNECTION_OK) disconnect();
  return failure;
}

StoreResult<PaymentStore::Created> PaymentStore::create(const PaymentRequest& r) {
  auto inserted = exec(kInsert.c_str(), {&r.order_id, &r.customer_id, &r.provider,
                                         &r.external_payment_id, &r.amount});
  if (auto* failure = std::get_if<StoreFailure>(&inserted)) return std::move(*failure);
  if (const Rows& rows = std::get<Rows>(inserted); rows.size() == 1)
    return Created{rows.payment(0), true};

  // ON CONFLICT waited for the conflicting insert to commit, so this statement's snapshot
  // sees that row.
  auto existing = exec(kSelectByReference.c_str(), {&r.provider, &r.external_payment_id});
  if (auto* failure = std::get_if<StoreFailure>(&existing)) return std::move(*failure);
  const Rows& rows = std::get<Rows>(existing);
  if (rows.size() != 1) return StoreFailure{"the conflicting payment row is not visible"};
  return Created{rows.payment(0), false};
}

StoreResult<std::optional<Payment>> PaymentStore::find(long long id) {
  const std::string id_text = std::to_string(id);
  auto found = exec(kSelectById.c_str(), {&id_text});
  if (auto* failure = std::get_if<StoreFailure>(&found)) return std::move(*failure);
  const Rows& rows = std::get<Rows>(found);
  if (rows.size() == 0) return std::optional<Payment>{};
  return std::optional<Payment>{rows.payment(0)};
}

StoreResult<PaymentStore::Refund> PaymentStore::refund(long long id) {
  const std::string id_text = std::to_string(id);
  auto updated = exec(kRefund.c_str(), {&id_text});
  if (auto* failure = std::get_if<StoreFailure>(&updated)) return std::move(*failure);
  if (const Rows& rows = std::get<Rows>(updated); rows.size() == 1)
    return Refund{RefundOutcome::refunded, rows.payment(0)};

  auto found = find(id);
  if (auto* failure = std::get_if<StoreFailure>(&found)) return std::move(*failure);
  auto& payment = std::get<std::optional<Payment>>(found);
  if (!payment) return Refund{RefundOutcome::not_found, std::nullopt};
  return Refund{RefundOutcome::already_refunded, std::move(payment)};
}

StoreResult<bool> PaymentStore::record_event(const EventRequest& e) {
  const std::string sql = R"sql(
WITH recorded AS (
    INSERT INTO processed_event (event_id, topic, consumer_name, expires_at)
    VALUES ($1, $2, $3, now() + interval '72 hours')
    ON CONFLICT (event_id) DO NOTHING
    RETURNING topic
), tallied AS (
    INSERT INTO event_tally (topic, deliveries)
    SELECT topic, 1 FROM recorded
    ON CONFLICT (topic) DO UPDATE SET deliveries = event_tally.deliveries + 1
    RETURNING topic
)
SELECT count(*) FROM tallied)sql";
  // One statement is one transaction: the dedup row and the unit of work commit together.
  auto done = exec(sql.c_str(), {&e.event_id, &e.topic, &e.consumer_name});
  if (auto* failure = std::get_if<StoreFailure>(&done)) return std::move(*failure);
  return std::get<Rows>(done).text(0, 0) == "1";
}

}  // namespace idemgate::examples::payment
