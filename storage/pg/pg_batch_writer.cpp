#include "storage/pg/pg_batch_writer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <deque>
#include <exception>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;
using core::store_errc;

using common::use_nothrow;

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

// Element type OIDs (pg_type.dat), checked by the server's array_recv.
constexpr std::uint32_t kBoolOid = 16;
constexpr std::uint32_t kByteaOid = 17;
constexpr std::uint32_t kInt8Oid = 20;
constexpr std::uint32_t kInt4Oid = 23;
constexpr std::uint32_t kTextOid = 25;

void put_be(std::string& out, std::uint64_t value, int bytes) {
  for (int shift = (bytes - 1) * 8; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// A one-dimensional array without NULLs in the binary wire format (array_send): dimensions,
// flags, element type, then per dimension its length and lower bound, then each element with its
// length. Elements are appended with element().
class BinaryArray {
 public:
  BinaryArray(std::uint32_t element_oid, std::size_t count, std::size_t reserve) {
    out_.reserve(20 + reserve + 4 * count);
    put_be(out_, 1, 4);  // dimensions
    put_be(out_, 0, 4);  // no NULLs
    put_be(out_, element_oid, 4);
    put_be(out_, count, 4);
    put_be(out_, 1, 4);  // lower bound
  }
  void element(std::string_view bytes) {
    put_be(out_, bytes.size(), 4);
    out_.append(bytes);
  }
  void element_be(std::uint64_t value, int bytes) {
    put_be(out_, static_cast<std::uint64_t>(bytes), 4);
    put_be(out_, value, bytes);
  }
  Param take() { return Param::bytes(std::move(out_)); }

 private:
  std::string out_;
};

struct Entry {
  explicit Entry(asio::any_io_executor executor) : wake(std::move(executor)) {}

  RecordRow row;
  Deadline deadline;
  asio::steady_timer wake;  // expires at the deadline; cancelled when the outcome is set
  std::optional<boost::system::result<bool>> outcome;
  bool abandoned = false;  // the caller stopped waiting: leave the row out if not yet sent
};

}  // namespace

struct PgBatchWriter::State {
  asio::any_io_executor executor;
  PgPool* pool;
  Options options;
  std::deque<std::shared_ptr<Entry>> queue;
  std::size_t in_flight = 0;
  bool stopped = false;
  std::uint64_t batches = 0;
  std::uint64_t rows = 0;
};

namespace {

void settle(Entry& entry, boost::system::result<bool> outcome) {
  if (entry.outcome) return;
  entry.outcome = std::move(outcome);
  entry.wake.cancel();
}

void settle(Entry& entry, bool stored) {
  settle(entry, boost::system::result<bool>(boost::system::in_place_value, stored));
}

void settle(Entry& entry, boost::system::error_code ec) {
  settle(entry, boost::system::result<bool>(boost::system::in_place_error, ec));
}

// Up to max_batch live entries from the front of the queue, no id twice; the entries passed
// over keep their place in the queue.
std::vector<std::shared_ptr<Entry>> take_batch(std::deque<std::shared_ptr<Entry>>& queue,
                                               std::size_t max_batch) {
  std::vector<std::shared_ptr<Entry>> batch;
  std::deque<std::shared_ptr<Entry>> passed_over;
  std::unordered_set<std::string_view> ids;
  const auto now = std::chrono::steady_clock::now();
  while (!queue.empty() && batch.size() < max_batch) {
    auto entry = std::move(queue.front());
    queue.pop_front();
    // A caller whose deadline has passed is answered by its own timer.
    if (entry->abandoned || entry->outcome || entry->deadline <= now) continue;
    if (!ids.insert(entry->row.id).second) {
      passed_over.push_back(std::move(entry));
      continue;
    }
    batch.push_back(std::move(entry));
  }
  while (!passed_over.empty()) {
    queue.push_front(std::move(passed_over.back()));
    passed_over.pop_back();
  }
  return batch;
}

std::vector<Param> batch_params(const std::vector<std::shared_ptr<Entry>>& batch) {
  std::size_t text_bytes = 0;
  std::size_t header_bytes = 0;
  std::size_t body_bytes = 0;
  for (const auto& e : batch) {
    text_bytes += e->row.route.size();
    header_bytes += e->row.headers.size();
    body_bytes += e->row.body.size();
  }
  const std::size_t n = batch.size();
  BinaryArray ids(kByteaOid, n, 32 * n);
  BinaryArray routes(kTextOid, n, text_bytes);
  BinaryArray fingerprints(kByteaOid, n, 32 * n);
  BinaryArray statuses(kInt4Oid, n, 4 * n);
  BinaryArray headers(kByteaOid, n, header_bytes);
  BinaryArray bodies(kByteaOid, n, body_bytes);
  BinaryArray omitted(kBoolOid, n, n);
  BinaryArray ttls(kInt8Oid, n, 8 * n);
  for (const auto& e : batch) {
    const RecordRow& row = e->row;
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
  params.push_back(ids.take());
  params.push_back(routes.take());
  params.push_back(fingerprints.take());
  params.push_back(statuses.take());
  params.push_back(headers.take());
  params.push_back(bodies.take());
  params.push_back(omitted.take());
  params.push_back(ttls.take());
  return params;
}

asio::awaitable<void> flush(std::shared_ptr<PgBatchWriter::State> state);

void start_flush(const std::shared_ptr<PgBatchWriter::State>& state) {
  if (state->stopped || state->queue.empty() || state->in_flight >= state->options.max_in_flight) {
    return;
  }
  ++state->in_flight;
  asio::co_spawn(state->executor, flush(state),
                 common::log_on_exception("postgres: batch writer failed"));
}

// Sends batches until the queue is empty. Runs while the next batch accumulates behind it.
asio::awaitable<void> flush(std::shared_ptr<PgBatchWriter::State> state) {
  struct InFlight {
    PgBatchWriter::State& s;
    ~InFlight() { --s.in_flight; }
  } in_flight{*state};

  while (!state->stopped) {
    auto batch = take_batch(state->queue, std::max<std::size_t>(1, state->options.max_batch));
    if (batch.empty()) break;
    Deadline until = batch.front()->deadline;
    for (const auto& e : batch) until = std::max(until, e->deadline);
    ++state->batches;
    state->rows += batch.size();

    boost::system::result<PgResult> written = store_errc::unavailable;
    auto lease = co_await state->pool->acquire(until);
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
      for (const auto& e : batch) {
        if (row_error) {
          settle(*e, false);
        } else {
          settle(*e, written.error());
        }
      }
      continue;
    }
    std::unordered_set<std::string_view> stored;
    for (int i = 0; i < written->rows(); ++i) stored.insert(written->bytes(i, 0));
    for (const auto& e : batch) {
      const bool row_stored = stored.contains(e->row.id);
      settle(*e, row_stored);
    }
  }
}

}  // namespace

PgBatchWriter::PgBatchWriter(asio::any_io_executor executor, PgPool& pool, Options options)
    : state_(std::make_shared<State>()) {
  state_->executor = std::move(executor);
  state_->pool = &pool;
  state_->options = options;
}

PgBatchWriter::~PgBatchWriter() {
  state_->stopped = true;
  for (const auto& e : state_->queue) settle(*e, make_error_code(store_errc::unavailable));
  state_->queue.clear();
}

asio::awaitable<boost::system::result<bool>> PgBatchWriter::insert(RecordRow row,
                                                                   Deadline deadline) {
  auto entry = std::make_shared<Entry>(state_->executor);
  entry->row = std::move(row);
  entry->deadline = deadline;
  entry->wake.expires_at(deadline);
  state_->queue.push_back(entry);
  start_flush(state_);

  // Runs also when this coroutine is destroyed while it waits.
  struct Abandon {
    Entry& e;
    ~Abandon() {
      if (!e.outcome) e.abandoned = true;
    }
  } abandon{*entry};
  co_await entry->wake.async_wait(use_nothrow);
  // Moved, not copied: a non-const lvalue would pick result<bool>'s explicit converting
  // constructor (bool from has_value()) over the copy constructor.
  if (entry->outcome) co_return std::move(*entry->outcome);
  co_return store_errc::timed_out;
}

std::uint64_t PgBatchWriter::batches_sent() const noexcept {
  return state_->batches;
}

std::uint64_t PgBatchWriter::rows_sent() const noexcept {
  return state_->rows;
}

}  // namespace idemgate::storage::pg
