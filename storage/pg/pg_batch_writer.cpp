#include "storage/pg/pg_batch_writer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/result.hpp>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "storage/pg/pg_binary.hpp"

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;
using core::store_errc;

// The same row semantics as PgRecordStore's single-row insert (replace only an expired row,
// leave a live one alone), for many rows at once. Only rows written come back.
constexpr Statement kBatchInsert{
    "idemgate_insert_record_batch",
    "INSERT INTO idempotency_record AS r"
    " (id, route, fingerprint, status, headers, body, body_omitted, expires_at)"
    " SELECT t.id, t.route, t.fingerprint, t.status, t.headers, t.body, t.body_omitted,"
    "        now() + t.ttl_ms * interval '1 millisecond'"
    " FROM unnest($1::bytea[], $2::text[], $3::bytea[], $4::int4[], $5::bytea[], $6::bytea[],"
    "             $7::bool[], $8::int8[])"
    "   AS t(id, route, fingerprint, status, headers, body, body_omitted, ttl_ms)"
    " ON CONFLICT (id) DO UPDATE SET route = EXCLUDED.route, fingerprint = EXCLUDED.fingerprint,"
    "  status = EXCLUDED.status, headers = EXCLUDED.headers, body = EXCLUDED.body,"
    "  body_omitted = EXCLUDED.body_omitted, created_at = EXCLUDED.created_at,"
    "  expires_at = EXCLUDED.expires_at"
    " WHERE r.expires_at <= now()"
    " RETURNING r.id"};

// One insert() call in a batch.
struct InsertItem final : BatchItem {
  InsertItem(asio::any_io_executor executor, RecordRow r, Deadline deadline)
      : BatchItem(std::move(executor), deadline), row(std::move(r)) {}

  std::string_view id() const noexcept override { return row.id; }
  void fail(boost::system::error_code ec) override { settle(ec); }
  /// true: the row is stored; false: it is not (a live row holds its id, or its batch failed
  /// on some row's statement error).
  void settle(bool stored) {
    if (settle_once()) outcome.emplace(boost::system::in_place_value, stored);
  }
  void settle(boost::system::error_code ec) {
    if (settle_once()) outcome.emplace(boost::system::in_place_error, ec);
  }

  RecordRow row;
  std::optional<boost::system::result<bool>> outcome;
};

InsertItem& insert_item(const std::shared_ptr<BatchItem>& item) {
  return static_cast<InsertItem&>(*item);
}

std::vector<Param> batch_params(const StatementBatch::Items& batch) {
  std::size_t text_bytes = 0;
  std::size_t header_bytes = 0;
  std::size_t body_bytes = 0;
  for (const auto& item : batch) {
    const RecordRow& row = insert_item(item).row;
    text_bytes += row.route.size();
    header_bytes += row.headers.size();
    body_bytes += row.body.size();
  }
  const std::size_t n = batch.size();
  binary::Array ids(binary::kByteaOid, n, 32 * n);
  binary::Array routes(binary::kTextOid, n, text_bytes);
  binary::Array fingerprints(binary::kByteaOid, n, 32 * n);
  binary::Array statuses(binary::kInt4Oid, n, 4 * n);
  binary::Array headers(binary::kByteaOid, n, header_bytes);
  binary::Array bodies(binary::kByteaOid, n, body_bytes);
  binary::Array omitted(binary::kBoolOid, n, n);
  binary::Array ttls(binary::kInt8Oid, n, 8 * n);
  for (const auto& item : batch) {
    const RecordRow& row = insert_item(item).row;
    ids.element(row.id);
    routes.element(row.route);
    fingerprints.element(row.fingerprint);
    statuses.element_be(static_cast<std::uint32_t>(row.status), 4);
    headers.element(row.headers);
    bodies.element(row.body);
    omitted.element_be(row.body_omitted ? 1 : 0, 1);
    ttls.element_be(static_cast<std::uint64_t>(row.ttl_ms), 8);
  }
  std::vector<Param> params;
  params.reserve(8);
  params.push_back(Param::bytes(ids.take()));
  params.push_back(Param::bytes(routes.take()));
  params.push_back(Param::bytes(fingerprints.take()));
  params.push_back(Param::bytes(statuses.take()));
  params.push_back(Param::bytes(headers.take()));
  params.push_back(Param::bytes(bodies.take()));
  params.push_back(Param::bytes(omitted.take()));
  params.push_back(Param::bytes(ttls.take()));
  return params;
}

// One batch: one statement on one pooled connection, every item settled from its result.
asio::awaitable<void> send_batch(PgPool& pool, const StatementBatch::Items& batch, Deadline until) {
  boost::system::result<PgResult> written = store_errc::unavailable;
  auto lease = co_await pool.acquire(until);
  if (!lease) {
    written = lease.error();
  } else {
    written = co_await (*lease)->execute(kBatchInsert, batch_params(batch), until);
    // Whatever failed, the retries (one by one, or the caller's C26 retry) take a fresh
    // connection: this one may point at a server that is no longer the primary.
    if (!written) (*lease)->discard();
  }

  if (!written) {
    // A statement error may come from any one row: in a batch of several, each caller is told
    // its row was not stored and settles it on its own (PgRecordStore's single-row insert).
    const bool row_error = written.error() == store_errc::protocol && batch.size() > 1;
    if (row_error) spdlog::warn("postgres: record batch failed; rows retried one by one");
    for (const auto& item : batch) {
      if (row_error) {
        insert_item(item).settle(false);
      } else {
        item->fail(written.error());
      }
    }
    co_return;
  }
  std::unordered_set<std::string_view> stored;
  for (int i = 0; i < written->rows(); ++i) stored.insert(written->bytes(i, 0));
  for (const auto& item : batch) insert_item(item).settle(stored.contains(item->id()));
}

}  // namespace

PgBatchWriter::PgBatchWriter(asio::any_io_executor executor, PgPool& pool, Options options)
    : batch_(std::move(executor), options,
             [pool = &pool](const StatementBatch::Items& items, Deadline until) {
               return send_batch(*pool, items, until);
             }) {}

PgBatchWriter::~PgBatchWriter() = default;

asio::awaitable<boost::system::result<bool>> PgBatchWriter::insert(RecordRow row,
                                                                   Deadline deadline) {
  auto item = std::make_shared<InsertItem>(batch_.executor(), std::move(row), deadline);
  if (!co_await batch_.submit(item)) co_return store_errc::timed_out;
  // Moved, not copied: a non-const lvalue would pick result<bool>'s explicit converting
  // constructor (bool from has_value()) over the copy constructor.
  co_return std::move(*item->outcome);
}

std::uint64_t PgBatchWriter::batches_sent() const noexcept {
  return batch_.batches_sent();
}

std::uint64_t PgBatchWriter::rows_sent() const noexcept {
  return batch_.items_sent();
}

}  // namespace idemgate::storage::pg
