// PgRecordStore with group commit (PgBatchWriter) and batched lookups (PgBatchReader) against a
// real Postgres (IDEMGATE_PG_DSN; the suite fails when it is not set): the RecordStore contract
// suite, plus the cases batching adds — concurrent inserts and lookups share a statement, one
// id twice in a burst, per-call deadlines, a row the database rejects failing alone.
#define BOOST_TEST_MODULE record_store_batched_pg
#include <libpq-fe.h>

#include <boost/asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "gateway/core/errors.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_batch_writer.hpp"
#include "storage/pg/pg_connection.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"
#include "tests/storage/pg_test_support.hpp"
#include "tests/storage/record_store_fixtures.hpp"

namespace idemgate::testing {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using core::store_errc;
using storage::pg::Param;
using storage::pg::PgConnection;
using storage::pg::PgPool;
using storage::pg::PgRecordStore;

PgRecordStore::Options group_commit() {
  PgRecordStore::Options options;
  options.group_commit = true;
  options.batch_max_body = 16 * 1024 * 1024;  // every contract case goes through the batch
  options.batch_lookups = true;
  return options;
}

struct PgBatchedBackend {
  explicit PgBatchedBackend(std::size_t connections = 2, std::chrono::milliseconds timeout = 5s)
      : pool(io.get_executor(), {pg_dsn(), connections, timeout, {}}),
        records(pool, io.get_executor(), group_commit()) {}

  core::RecordStore& store() { return records; }
  const storage::pg::PgBatchWriter& writer() const { return *records.batch_writer(); }
  const storage::pg::PgBatchReader& reader() const { return *records.batch_reader(); }

  template <class T>
  T run(asio::awaitable<T> op) {
    return run_to_completion(io, std::move(op));
  }

  asio::awaitable<void> wait_until_expired(core::Sha256 id) {
    return wait_until_db_clock_passes_expiry(pool, id);
  }

  /// Starts every insert at once on this thread and runs them all to completion.
  std::vector<boost::system::result<core::InsertResult>> insert_together(
      const std::vector<core::StoredRecord>& batch, std::chrono::milliseconds ttl) {
    return testing::insert_together(io, records, batch, ttl);
  }

  /// Starts every lookup at once on this thread and runs them all to completion.
  std::vector<boost::system::result<std::optional<core::StoredRecord>>> find_together(
      const std::vector<core::Sha256>& ids) {
    return testing::find_together(io, records, ids);
  }

  asio::io_context io;
  PgPool pool;
  PgRecordStore records;
};

using RecordStoreBackends = std::tuple<PgBatchedBackend>;

}  // namespace idemgate::testing

using idemgate::testing::MigratedDatabase;
BOOST_TEST_GLOBAL_FIXTURE(MigratedDatabase);

#include "tests/storage/record_store_contract.hpp"  // the shared cases, run on PgBatchedBackend

BOOST_AUTO_TEST_SUITE(pg_batched_record_store)

using namespace idemgate::testing;

BOOST_AUTO_TEST_CASE(concurrent_inserts_of_one_thread_share_one_statement) {
  PgBatchedBackend backend;
  std::vector<idemgate::core::StoredRecord> batch;
  for (int i = 0; i < 40; ++i) batch.push_back(sample_record("burst-" + std::to_string(i)));

  const auto results = backend.insert_together(batch, kLongTtl);
  for (const auto& r : results) {
    BOOST_TEST_REQUIRE(r.has_value(), r.error().message());
    BOOST_TEST(r->inserted);
  }
  // Started in one turn of the io loop, they need at most one batch per flusher that left at
  // once and one more that collected behind them.
  BOOST_TEST(backend.writer().rows_sent() == 40u);
  BOOST_TEST(backend.writer().batches_sent() <=
             idemgate::storage::pg::PgBatchWriter::Options{}.max_in_flight + 1);
  for (const auto& record : batch) {
    auto found = backend.run(backend.store().find(record.id));
    BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
    BOOST_TEST_REQUIRE(found->has_value());
    check_same_response(**found, record);
  }
}

BOOST_AUTO_TEST_CASE(concurrent_lookups_of_one_thread_share_one_statement_and_each_gets_its_row) {
  PgBatchedBackend backend;
  std::vector<idemgate::core::StoredRecord> stored;
  for (int i = 0; i < 20; ++i) stored.push_back(sample_record("lookup-" + std::to_string(i)));
  for (const auto& r : backend.insert_together(stored, kLongTtl)) {
    BOOST_TEST_REQUIRE(r.has_value(), r.error().message());
  }
  // Stored and absent ids interleaved, one stored id asked twice.
  std::vector<idemgate::core::Sha256> ids;
  for (const auto& record : stored) {
    ids.push_back(record.id);
    ids.push_back(random_id());
  }
  ids.push_back(stored.front().id);

  const auto found = backend.find_together(ids);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    BOOST_TEST_REQUIRE(found[i].has_value(), found[i].error().message());
    if (i == ids.size() - 1) {
      BOOST_TEST_REQUIRE(found[i]->has_value());
      check_same_response(**found[i], stored.front());
    } else if (i % 2 == 0) {
      BOOST_TEST_REQUIRE(found[i]->has_value());
      check_same_response(**found[i], stored[i / 2]);
    } else {
      BOOST_TEST(!found[i]->has_value());
    }
  }
  // Started in one turn of the io loop: one statement per flusher that left at once, one more
  // that collected behind them, and one for the id asked twice (never twice in one batch).
  BOOST_TEST(backend.reader().lookups_sent() == ids.size());
  BOOST_TEST(backend.reader().batches_sent() <=
             idemgate::storage::pg::PgBatchReader::Options{}.max_in_flight + 2);
}

BOOST_AUTO_TEST_CASE(spec_C36_one_id_twice_in_a_burst_stores_one_record_and_returns_it_to_both) {
  PgBatchedBackend backend;
  auto first = sample_record("first");
  auto second = sample_record("second");
  second.id = first.id;

  const auto results = backend.insert_together({first, second}, kLongTtl);
  BOOST_TEST_REQUIRE(results[0].has_value(), results[0].error().message());
  BOOST_TEST_REQUIRE(results[1].has_value(), results[1].error().message());
  // The two never share a statement, and which batch reaches Postgres first is not part of the
  // contract: exactly one is stored, and the other caller gets that one back.
  BOOST_TEST_REQUIRE(results[0]->inserted != results[1]->inserted);
  const std::size_t loser = results[0]->inserted ? 1 : 0;
  BOOST_TEST_REQUIRE(results[loser]->existing.has_value());
  check_same_response(*results[loser]->existing, loser == 1 ? first : second);
}

BOOST_AUTO_TEST_CASE(row_rejected_by_the_database_fails_alone_and_its_batch_neighbours_are_stored) {
  PgBatchedBackend backend;
  std::vector<idemgate::core::StoredRecord> batch;
  for (int i = 0; i < 5; ++i) batch.push_back(sample_record("neighbour-" + std::to_string(i)));
  batch[2].response.status = 99;  // violates the table's CHECK (status BETWEEN 100 AND 599)

  const auto results = backend.insert_together(batch, kLongTtl);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (i == 2) {
      BOOST_TEST_REQUIRE(!results[i].has_value());
      BOOST_TEST(results[i].error() == make_error_code(store_errc::protocol));
      continue;
    }
    BOOST_TEST_REQUIRE(results[i].has_value(), results[i].error().message());
    BOOST_TEST(results[i]->inserted);
  }
}

BOOST_AUTO_TEST_CASE(spec_C25_stalled_batch_times_out_at_each_callers_deadline_and_recovers) {
  PgBatchedBackend backend(1, 300ms);
  const auto blocked = sample_record("blocked");
  const auto neighbour = sample_record("neighbour");

  // Another session inserts the same id and keeps its transaction open: the batch carrying our
  // row has to wait for it, past our deadline.
  PgConnection blocker(backend.io.get_executor(), pg_dsn(), 60s);
  BOOST_TEST_REQUIRE(backend.run(blocker.connect(soon())).has_value(), blocker.last_error());
  BOOST_TEST_REQUIRE(backend.run(blocker.query("BEGIN", {}, soon())).has_value());
  std::vector<Param> params;
  params.push_back(Param::bytes(bytes_of(blocked.id)));
  params.push_back(Param::bytes(bytes_of(blocked.fingerprint)));
  auto held = backend.run(blocker.query(
      "INSERT INTO idempotency_record (id, route, fingerprint, status, headers, body, expires_at)"
      " VALUES ($1, 'blocker', $2, 200, '\\x01'::bytea, ''::bytea, now() + interval '1 hour')",
      std::move(params), soon()));
  BOOST_TEST_REQUIRE(held.has_value(), blocker.last_error());

  const auto started = std::chrono::steady_clock::now();
  const auto stalled = backend.insert_together({blocked, neighbour}, kLongTtl);
  const auto waited = std::chrono::steady_clock::now() - started;
  for (const auto& r : stalled) {
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error() == make_error_code(store_errc::timed_out));
  }
  BOOST_TEST((waited >= backend.pool.options().operation_timeout));
  BOOST_TEST(backend.pool.open_connections() == 0u);  // the timed-out connection was discarded

  BOOST_TEST_REQUIRE(backend.run(blocker.query("ROLLBACK", {}, soon())).has_value());
  // The abandoned statement may have gone on to write both rows once the blocker let go: either
  // way a retry works and the stored records are ours.
  for (const auto& record : {blocked, neighbour}) {
    auto retried = backend.run(backend.store().insert(record, kLongTtl));
    BOOST_TEST_REQUIRE(retried.has_value(), retried.error().message());
    if (!retried->inserted) {
      BOOST_TEST_REQUIRE(retried->existing.has_value());
      check_same_response(*retried->existing, record);
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C16_record_over_the_batch_body_limit_goes_one_by_one) {
  boost::asio::io_context io;
  PgPool pool(io.get_executor(), {pg_dsn(), 1, 5s, {}});
  PgRecordStore::Options options;
  options.group_commit = true;
  options.batch_max_body = 16;
  PgRecordStore store(pool, io.get_executor(), options);
  auto small = sample_record("small");
  small.response.body = "{}";
  auto large = sample_record("large");
  large.response.body.assign(1024, 'x');

  auto a = run_to_completion(io, store.insert(small, kLongTtl));
  auto b = run_to_completion(io, store.insert(large, kLongTtl));
  BOOST_TEST_REQUIRE(a.has_value(), a.error().message());
  BOOST_TEST_REQUIRE(b.has_value(), b.error().message());
  BOOST_TEST(a->inserted);
  BOOST_TEST(b->inserted);
  BOOST_TEST(store.batch_writer()->rows_sent() == 1u);
  auto found = run_to_completion(io, store.find(large.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  check_same_response(**found, large);
}

BOOST_AUTO_TEST_SUITE_END()
