// `idempotency_record` hash-partitioned by id (`idemgate migrate --partitions N`), against a
// private Postgres and Redis (scripts/local-stores): the RecordStore contract suite with single
// and group-commit inserts on a table converted to 4 partitions before any case runs, the
// cleaner working partition by partition (SPEC C24), and the migration itself in schemas of
// its own — rows kept, a second run a no-op, another count refused — with the real `idemgate`
// binary, also serving keyed requests and replays across a conversion (C15, C16).
//
// Lines `figures scenario=<name> …` give the measured times of the conversion and the cleaner.
#define BOOST_TEST_MODULE pg_partitions_scale_e2e
#include <boost/asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gateway/cleaner.hpp"
#include "gateway/config/config.hpp"
#include "gateway/core/hash.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"
#include "tests/e2e/gateway_fixture.hpp"
#include "tests/storage/pg_test_support.hpp"
#include "tests/storage/record_store_fixtures.hpp"
#include "tests/support/local_stores.hpp"
#include "tests/support/polling.hpp"
#include "tests/support/process.hpp"

namespace idemgate::testing {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using storage::pg::PartitionReport;
using storage::pg::PgPool;
using storage::pg::PgRecordStore;
using Clock = std::chrono::steady_clock;

constexpr int kPartitions = 4;

/// The suite's stores: a private Postgres and Redis whose addresses LocalStores exports into
/// the environment (so pg_dsn() and the e2e fixture use them), with `idempotency_record`
/// converted to kPartitions hash partitions before any case runs.
struct PartitionedStores {
  PartitionedStores() {
    auto report = storage::pg::partition_records(pg_dsn(), kPartitions);
    if (!report) throw std::runtime_error("partition_records: " + report.error().message());
    if (report->outcome != PartitionReport::Outcome::converted) {
      throw std::runtime_error("the suite's table was not converted");
    }
  }
  test::LocalStores stores;
};

/// A PgRecordStore over the partitioned table, with single-row inserts or group commit.
template <bool GroupCommit>
struct PartitionedBackend {
  explicit PartitionedBackend(std::string dsn = pg_dsn(), bool prepared = true)
      : pool(io.get_executor(), {std::move(dsn), 2, 5s, {}, prepared}),
        records(pool, io.get_executor(), options()) {}

  static PgRecordStore::Options options() {
    PgRecordStore::Options options;
    options.group_commit = GroupCommit;
    options.batch_max_body = 16 * 1024 * 1024;  // with group commit, every insert is batched
    return options;
  }

  core::RecordStore& store() { return records; }

  template <class T>
  T run(asio::awaitable<T> op) {
    return run_to_completion(io, std::move(op));
  }

  asio::awaitable<void> wait_until_expired(core::Sha256 id) {
    return wait_until_db_clock_passes_expiry(pool, id);
  }

  /// The partition holding the row `id` ("" when there is none).
  std::string partition_of(const core::Sha256& id) {
    std::vector<storage::pg::Param> params;
    params.push_back(storage::pg::Param::bytes(bytes_of(id)));
    auto rows =
        run(pool.query("SELECT tableoid::regclass::text FROM idempotency_record WHERE id = $1",
                       std::move(params)));
    if (!rows) throw std::runtime_error("partition_of: " + rows.error().message());
    return rows->rows() == 0 ? "" : std::string(rows->bytes(0, 0));
  }

  /// How many of `wanted` have a row, expired or not.
  std::size_t rows_of(const std::vector<core::StoredRecord>& wanted) {
    std::string ids;
    for (const auto& record : wanted) {
      if (!ids.empty()) ids += ',';
      ids += core::to_hex(record.id);
    }
    std::vector<storage::pg::Param> params;
    params.push_back(storage::pg::Param::text(ids));
    auto rows =
        run(pool.query("SELECT count(*) FROM idempotency_record"
                       " WHERE encode(id, 'hex') = ANY(string_to_array($1, ','))",
                       std::move(params)));
    if (!rows) throw std::runtime_error("rows_of: " + rows.error().message());
    return static_cast<std::size_t>(rows->int8(0, 0).value());
  }

  /// Starts every insert at once on this thread (with group commit they share statements) and
  /// runs them all to completion.
  std::vector<boost::system::result<core::InsertResult>> insert_together(
      const std::vector<core::StoredRecord>& batch, std::chrono::milliseconds ttl) {
    return testing::insert_together(io, records, batch, ttl);
  }

  asio::io_context io;
  PgPool pool;
  PgRecordStore records;
};

using SingleInsertBackend = PartitionedBackend<false>;
using GroupCommitBackend = PartitionedBackend<true>;
using RecordStoreBackends = std::tuple<SingleInsertBackend, GroupCommitBackend>;

}  // namespace idemgate::testing

using idemgate::testing::PartitionedStores;
BOOST_TEST_GLOBAL_FIXTURE(PartitionedStores);

#include "tests/storage/record_store_contract.hpp"  // the shared cases, on both backends

namespace {

using namespace idemgate::testing;
using namespace std::chrono_literals;
namespace e2e = idemgate::test::e2e;
using idemgate::core::StoredRecord;

/// Inserts records with `ttl` until every partition holds at least `per_partition` of them;
/// returns them in insertion order (with a short ttl the last one expires last).
template <class Backend>
std::vector<StoredRecord> fill_every_partition(Backend& backend, const std::string& tag,
                                               std::chrono::milliseconds ttl,
                                               int per_partition = 2) {
  std::vector<StoredRecord> records;
  std::map<std::string, int> held;
  for (int i = 0; i < 400; ++i) {
    records.push_back(sample_record(tag + "-" + std::to_string(i)));
    auto inserted = backend.run(backend.store().insert(records.back(), ttl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
    BOOST_TEST_REQUIRE(inserted->inserted);
    ++held[backend.partition_of(records.back().id)];
    bool full = held.size() == static_cast<std::size_t>(kPartitions);
    for (const auto& [partition, count] : held) full = full && count >= per_partition;
    if (full) return records;
  }
  BOOST_FAIL("random ids never reached every partition");
  return records;
}

/// The partition names, in order, that the catalog lists for the table `dsn` sees.
std::vector<std::string> catalog_partitions(const std::string& dsn) {
  const std::string list = exec_blocking(
      dsn,
      "SELECT coalesce(string_agg(inhrelid::regclass::text, ',' ORDER BY inhrelid), '')"
      " FROM pg_inherits WHERE inhparent = to_regclass('idempotency_record')");
  std::vector<std::string> names;
  std::size_t start = 0;
  while (start < list.size()) {
    const auto end = list.find(',', start);
    names.push_back(list.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return names;
}

/// `idemgate migrate --config F ARGS…` against `dsn`: its exit status and stderr.
struct MigrateRun {
  int status = -1;
  std::string stderr_text;
  std::chrono::milliseconds took{0};
};

MigrateRun migrate(const std::string& dsn, const std::vector<std::string>& args) {
  e2e::TempDir dir;
  e2e::GatewayConfig config;
  config.postgres_dsn = dsn;
  config.upstreams = {{"unused", {"127.0.0.1:9"}}};
  e2e::RouteConfig route;
  route.name = "unused";
  route.path_prefix = "/";
  route.upstream = "unused";
  config.routes = {route};
  const std::string path = (dir.path() / "gateway.yaml").string();
  {
    std::ofstream out(path);
    out << config.render();
  }
  idemgate::test::ChildOptions options;
  options.executable = idemgate::test::require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  options.args = {"migrate", "--config", path};
  options.args.insert(options.args.end(), args.begin(), args.end());
  options.stderr_path = (dir.path() / "stderr").string();
  options.stdout_path = (dir.path() / "stdout").string();
  MigrateRun run;
  const auto started = Clock::now();
  idemgate::test::ChildProcess child(options);
  const auto status = child.wait_for(e2e::kEventDeadline);
  run.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  run.status = status ? *status : child.stop();
  run.stderr_text = idemgate::test::read_text_file(options.stderr_path);
  BOOST_TEST_REQUIRE(status.has_value(), "migrate did not finish: " << run.stderr_text);
  return run;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The oids of the table and its partitions, in order: they change when the table is rebuilt.
std::string table_oids(const std::string& dsn) {
  return exec_blocking(dsn,
                       "SELECT to_regclass('idempotency_record')::oid::text || ':' ||"
                       " coalesce((SELECT string_agg(inhrelid::text, ',' ORDER BY inhrelid)"
                       " FROM pg_inherits WHERE inhparent = to_regclass('idempotency_record')),"
                       " '')");
}

/// `postgresql://postgres@…` for the `postgresql://idem@…` DSN `dsn`: the private server's
/// superuser (trust authentication).
std::string as_superuser(const std::string& dsn) {
  const auto at = dsn.find('@');
  BOOST_TEST_REQUIRE(at != std::string::npos, dsn);
  return "postgresql://postgres" + dsn.substr(at);
}

/// A login-less role of the private server, dropped afterwards.
struct ScratchRole {
  ScratchRole() : name("partition_reader_" + idemgate::core::random_token().substr(0, 8)) {
    exec_blocking(as_superuser(pg_dsn()), "CREATE ROLE " + name);
  }
  ~ScratchRole() {
    try {
      exec_blocking(as_superuser(pg_dsn()), "DROP ROLE " + name);
    } catch (const std::exception& e) {
      BOOST_TEST_MESSAGE("dropping " << name << ": " << e.what());
    }
  }
  std::string name;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(partitioned_record_store)

BOOST_AUTO_TEST_CASE(the_suite_table_is_hash_partitioned_by_id_with_keys_checks_and_indexes) {
  const std::string dsn = pg_dsn();
  BOOST_TEST(exec_blocking(dsn, "SELECT pg_get_partkeydef(to_regclass('idempotency_record'))") ==
             "HASH (id)");
  const std::vector<std::string> expected = {"idempotency_record_p0", "idempotency_record_p1",
                                             "idempotency_record_p2", "idempotency_record_p3"};
  BOOST_TEST(catalog_partitions(dsn) == expected, boost::test_tools::per_element());

  SingleInsertBackend backend;
  auto listed = backend.run(backend.records.partitions());
  BOOST_TEST_REQUIRE(listed.has_value(), listed.error().message());
  BOOST_TEST(*listed == expected, boost::test_tools::per_element());

  for (const auto& partition : expected) {
    BOOST_TEST_CONTEXT(partition) {
      BOOST_TEST(exec_blocking(dsn,
                               "SELECT pg_get_expr(relpartbound, oid) FROM pg_class"
                               " WHERE oid = '" +
                                   partition + "'::regclass") ==
                 "FOR VALUES WITH (modulus 4, remainder " + partition.substr(20) + ")");
      BOOST_TEST(exec_blocking(dsn, "SELECT count(*) FROM pg_constraint WHERE conrelid = '" +
                                        partition + "'::regclass AND contype = 'c'") == "3");
      BOOST_TEST(exec_blocking(dsn,
                               "SELECT string_agg(pg_get_indexdef(indexrelid), '; ' ORDER BY"
                               " indisprimary DESC) FROM pg_index WHERE indrelid = '" +
                                   partition + "'::regclass") ==
                 "CREATE UNIQUE INDEX " + partition + "_pkey ON public." + partition +
                     " USING btree (id); CREATE INDEX " + partition + "_expires_at_idx ON public." +
                     partition + " USING btree (expires_at)");
    }
  }
}

// ON CONFLICT (id) on the parent: the primary key holds the partition key, so a new record
// replaces an expired one in whichever partition its id hashes to, with single-row and batched
// statements, several partitions in one batch.
BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C24_expired_rows_in_every_partition_are_replaced_in_place,
                              Backend, RecordStoreBackends) {
  Backend backend;
  const auto old_records = fill_every_partition(backend, "old", 1ms);
  std::map<std::string, std::string> partition_before;
  for (const auto& record : old_records) {
    partition_before[idemgate::core::to_hex(record.id)] = backend.partition_of(record.id);
  }
  backend.run(backend.wait_until_expired(old_records.back().id));

  std::vector<StoredRecord> new_records;
  for (const auto& old_record : old_records) {
    new_records.push_back(sample_record("new"));
    new_records.back().id = old_record.id;
  }
  const auto results = backend.insert_together(new_records, kLongTtl);
  for (std::size_t i = 0; i < new_records.size(); ++i) {
    BOOST_TEST_CONTEXT("record " << i) {
      BOOST_TEST_REQUIRE(results[i].has_value(), results[i].error().message());
      BOOST_TEST(results[i]->inserted);
      auto found = backend.run(backend.store().find(new_records[i].id));
      BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
      BOOST_TEST_REQUIRE(found->has_value());
      check_same_response(**found, new_records[i]);
      BOOST_TEST(backend.rows_of({new_records[i]}) == 1u);
      BOOST_TEST(backend.partition_of(new_records[i].id) ==
                 partition_before[idemgate::core::to_hex(new_records[i].id)]);
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C24_delete_expired_on_one_partition_leaves_the_others_alone) {
  SingleInsertBackend backend;
  const auto expired = fill_every_partition(backend, "expired", 1ms);
  backend.run(backend.wait_until_expired(expired.back().id));

  std::vector<StoredRecord> in_p0;
  std::vector<StoredRecord> elsewhere;
  for (const auto& record : expired) {
    (backend.partition_of(record.id) == "idempotency_record_p0" ? in_p0 : elsewhere)
        .push_back(record);
  }
  // Batches of 2 until one comes back short: the cleaner's loop, on p0 only.
  std::int64_t deleted = 0;
  for (int round = 0; round < 10'000; ++round) {
    auto batch = backend.run(backend.records.delete_expired(2, "idempotency_record_p0"));
    BOOST_TEST_REQUIRE(batch.has_value(), batch.error().message());
    BOOST_TEST_REQUIRE(*batch <= 2);
    deleted += *batch;
    if (*batch < 2) break;
  }
  BOOST_TEST(deleted >= static_cast<std::int64_t>(in_p0.size()));
  for (const auto& record : in_p0) BOOST_TEST(backend.partition_of(record.id).empty());
  for (const auto& record : elsewhere) BOOST_TEST(!backend.partition_of(record.id).empty());
}

// The gateway's cleaner (SPEC C24), in both prepared_statements modes (C44): each round lists
// the partitions and empties each one's expired rows in batches; live rows stay.
BOOST_AUTO_TEST_CASE(spec_C24_cleaner_deletes_expired_rows_from_every_partition_and_keeps_live) {
  for (const bool prepared : {true, false}) {
    BOOST_TEST_CONTEXT("prepared_statements " << prepared) {
      SingleInsertBackend backend;
      const auto expired = fill_every_partition(backend, "expired", 1ms, 3);
      const auto live = fill_every_partition(backend, "live", kLongTtl);
      backend.run(backend.wait_until_expired(expired.back().id));

      idemgate::config::Config config;
      config.storage.postgres.dsn = pg_dsn();
      config.storage.postgres.prepared_statements = prepared;
      config.storage.cleanup.interval = 100ms;
      config.storage.cleanup.batch = 2;
      idemgate::Cleaner cleaner(config);
      const auto started = Clock::now();
      cleaner.start();
      auto remaining = [&] { return backend.rows_of(expired); };
      // Polls the database, the only place the outcome shows, until the rows are gone.
      idemgate::test::eventually([&] { return remaining() == 0; }, 50ms);
      const auto took = Clock::now() - started;
      cleaner.stop();

      BOOST_TEST(remaining() == 0u);
      BOOST_TEST(cleaner.deleted_total() >= expired.size());
      for (const auto& record : live) {
        auto found = backend.run(backend.store().find(record.id));
        BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
        BOOST_TEST(found->has_value());
      }
      std::cout << "figures scenario=cleaner_per_partition prepared=" << prepared
                << " partitions=" << kPartitions << " expired_rows=" << expired.size()
                << " deleted_total=" << cleaner.deleted_total() << " batch=2 interval_ms=100"
                << " cleaned_within_ms="
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << "\n";
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(migrate_partitions)

BOOST_AUTO_TEST_CASE(rows_existing_before_the_conversion_replay_after_it) {
  ScratchSchema schema;
  auto applied = idemgate::storage::pg::apply_migrations(schema.dsn);
  BOOST_TEST_REQUIRE(applied.has_value(), applied.error().message());
  SingleInsertBackend backend(schema.dsn);
  std::vector<StoredRecord> live;
  for (int i = 0; i < 24; ++i) {
    live.push_back(sample_record("before-" + std::to_string(i)));
    auto inserted = backend.run(backend.store().insert(live.back(), kLongTtl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  }
  const auto expired = sample_record("expired-before");
  BOOST_TEST_REQUIRE(backend.run(backend.store().insert(expired, 1ms)).has_value());
  backend.run(backend.wait_until_expired(expired.id));

  const auto run = migrate(schema.dsn, {"--partitions", "4"});
  BOOST_TEST_REQUIRE(run.status == 0, run.stderr_text);
  BOOST_TEST(contains(run.stderr_text, "idempotency_record converted to hash partitions"),
             run.stderr_text);
  BOOST_TEST(contains(run.stderr_text, "\"rows_moved\":24"), run.stderr_text);
  BOOST_TEST(catalog_partitions(schema.dsn).size() == 4u);
  std::cout << "figures scenario=migrate_partitions rows=24 partitions=4 migrate_wall_ms="
            << run.took.count() << "\n";

  // The pool's connections were opened before the conversion: their statements find the new
  // table by name, as a running gateway's do.
  std::set<std::string> partitions_used;
  for (const auto& record : live) {
    auto found = backend.run(backend.store().find(record.id));
    BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
    BOOST_TEST_REQUIRE(found->has_value());
    check_same_response(**found, record);
    partitions_used.insert(backend.partition_of(record.id));
  }
  BOOST_TEST(partitions_used.size() > 1u);
  // Expired rows are absent (C24) and were not copied.
  BOOST_TEST(backend.partition_of(expired.id).empty());

  // ON CONFLICT still arbitrates: a second record with a live id gets the first one back (C36).
  auto second = sample_record("second");
  second.id = live.front().id;
  auto lost = backend.run(backend.store().insert(second, kLongTtl));
  BOOST_TEST_REQUIRE(lost.has_value(), lost.error().message());
  BOOST_TEST(!lost->inserted);
  BOOST_TEST_REQUIRE(lost->existing.has_value());
  check_same_response(*lost->existing, live.front());

  // A gateway starting with auto-migrate finds 001 recorded and touches nothing.
  const auto oids = table_oids(schema.dsn);
  auto again = idemgate::storage::pg::apply_migrations(schema.dsn);
  BOOST_TEST_REQUIRE(again.has_value(), again.error().message());
  BOOST_TEST(*again == 0);
  BOOST_TEST(table_oids(schema.dsn) == oids);
}

BOOST_AUTO_TEST_CASE(the_same_count_again_is_a_no_op_and_another_count_is_refused) {
  ScratchSchema schema;
  auto first = idemgate::storage::pg::partition_records(schema.dsn, 4);
  BOOST_TEST_REQUIRE(first.has_value(), first.error().message());
  BOOST_TEST((first->outcome == PartitionReport::Outcome::converted));
  BOOST_TEST(first->migrations_applied == 1);
  const auto oids = table_oids(schema.dsn);

  const auto same = migrate(schema.dsn, {"--partitions", "4"});
  BOOST_TEST(same.status == 0, same.stderr_text);
  BOOST_TEST(contains(same.stderr_text,
                      "idempotency_record is already hash-partitioned by id into 4 partitions; "
                      "nothing to do"),
             same.stderr_text);
  BOOST_TEST(table_oids(schema.dsn) == oids);

  const auto other = migrate(schema.dsn, {"--partitions", "8"});
  BOOST_TEST(other.status == 1, other.stderr_text);
  BOOST_TEST(contains(other.stderr_text,
                      "idempotency_record is already hash-partitioned by id into 4 partitions; "
                      "converting it to 8 hash partitions is not supported in place"),
             other.stderr_text);
  BOOST_TEST(table_oids(schema.dsn) == oids);

  // A table partitioned some other way is refused too, naming its key.
  ScratchSchema ranged;
  exec_blocking(ranged.dsn,
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now());"
                "INSERT INTO schema_migrations (version) VALUES (1);"
                "CREATE TABLE idempotency_record (id bytea, expires_at timestamptz)"
                " PARTITION BY RANGE (expires_at)");
  const auto range = migrate(ranged.dsn, {"--partitions", "4"});
  BOOST_TEST(range.status == 1, range.stderr_text);
  BOOST_TEST(contains(range.stderr_text,
                      "idempotency_record is already partitioned by RANGE"
                      " (expires_at) (0 partitions)"),
             range.stderr_text);
}

BOOST_AUTO_TEST_CASE(a_count_outside_2_to_1024_or_the_flag_without_migrate_is_a_usage_error) {
  for (const std::string n : {"1", "1025"}) {
    const auto run = migrate(pg_dsn(), {"--partitions", n});
    BOOST_TEST(run.status == 2, run.stderr_text);
    BOOST_TEST(contains(run.stderr_text, "idemgate: --partitions takes N from 2 to 1024, not " + n),
               run.stderr_text);
  }
  idemgate::test::ChildOptions options;
  options.executable = idemgate::test::require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  options.args = {"check-config", "unused.yaml", "--partitions", "4"};
  e2e::TempDir dir;
  options.stderr_path = (dir.path() / "stderr").string();
  options.stdout_path = (dir.path() / "stdout").string();
  idemgate::test::ChildProcess child(options);
  const auto status = child.wait_for(e2e::kEventDeadline);
  const auto text = idemgate::test::read_text_file(options.stderr_path);
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(*status == 2, text);
  BOOST_TEST(contains(text, "idemgate: --partitions applies to migrate only"), text);
}

// Run as the superuser, the conversion still leaves the tables to their owner, and every grant
// of the old table holds on the new one and each partition (the cleaner deletes per partition).
BOOST_AUTO_TEST_CASE(the_conversion_keeps_the_owner_and_grants_on_every_partition) {
  ScratchRole reader;
  ScratchSchema schema;
  auto applied = idemgate::storage::pg::apply_migrations(schema.dsn);
  BOOST_TEST_REQUIRE(applied.has_value(), applied.error().message());
  exec_blocking(schema.dsn, "GRANT SELECT, DELETE ON idempotency_record TO " + reader.name);

  const auto superuser_dsn = as_superuser(schema.dsn);
  auto report = idemgate::storage::pg::partition_records(superuser_dsn, 3);
  BOOST_TEST_REQUIRE(report.has_value(), report.error().message());
  BOOST_TEST_REQUIRE((report->outcome == PartitionReport::Outcome::converted));

  auto tables = catalog_partitions(schema.dsn);
  BOOST_TEST_REQUIRE(tables.size() == 3u);
  tables.push_back("idempotency_record");
  for (const auto& table : tables) {
    BOOST_TEST_CONTEXT(table) {
      const std::string rel = "'" + schema.name + "." + table + "'";
      BOOST_TEST(exec_blocking(pg_dsn(),
                               "SELECT pg_get_userbyid(relowner) FROM pg_class"
                               " WHERE oid = " +
                                   rel + "::regclass") == "idem");
      BOOST_TEST(exec_blocking(pg_dsn(), "SELECT has_table_privilege('" + reader.name + "', " +
                                             rel + ", 'SELECT') AND has_table_privilege('" +
                                             reader.name + "', " + rel + ", 'DELETE')") == "t");
      BOOST_TEST(exec_blocking(pg_dsn(), "SELECT has_table_privilege('" + reader.name + "', " +
                                             rel + ", 'INSERT')") == "f");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gateway_on_partitions)

namespace {

std::string route_yaml() {
  // replay_cache_ttl 0s: no committed marker in Redis, so every replay reads Postgres.
  return "  - name: partitioned\n"
         "    match: { path_prefix: /payments, methods: [POST] }\n"
         "    upstream: payments\n"
         "    idempotency:\n"
         "      mode: required\n"
         "      methods: [POST]\n"
         "      replay_cache_ttl: 0s\n";
}

void check_replay(const e2e::Gateway& gateway, const std::string& key, const std::string& body,
                  const idemgate::test::HttpResponse& first) {
  const auto replay = gateway.send(e2e::keyed_post("/payments", key, body));
  BOOST_TEST(replay.status == first.status, gateway.explain(replay));
  BOOST_TEST(replay.header("Idempotent-Replayed").value_or("") == "true", gateway.explain(replay));
  BOOST_TEST(replay.body == first.body);
}

}  // namespace

// `idemgate migrate --partitions 4` while a gateway runs: records written before replay from
// the partitions through the same gateway, new keys execute once and replay, and a gateway
// started afterwards (auto-migrate: nothing to apply) replays them all (SPEC C15, C16).
BOOST_AUTO_TEST_CASE(spec_C16_keys_replay_across_a_conversion_and_a_restart_on_partitions) {
  ScratchSchema schema;
  e2e::PaymentService payments;
  e2e::GatewayConfig config;
  config.postgres_dsn = schema.dsn;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml = route_yaml();

  const std::string key_before = e2e::unique_name("before");
  const std::string body_before = e2e::payment_body(e2e::unique_name("pay"));
  const std::string key_after = e2e::unique_name("after");
  const std::string body_after = e2e::payment_body(e2e::unique_name("pay"));
  idemgate::test::HttpResponse first_before;
  idemgate::test::HttpResponse first_after;
  {
    e2e::Gateway gateway(config);
    first_before = gateway.send(e2e::keyed_post("/payments", key_before, body_before));
    BOOST_TEST_REQUIRE(first_before.status == 201u, gateway.explain(first_before));
    check_replay(gateway, key_before, body_before, first_before);

    const auto run = migrate(schema.dsn, {"--partitions", "4"});
    BOOST_TEST_REQUIRE(run.status == 0, run.stderr_text);
    BOOST_TEST(contains(run.stderr_text, "\"rows_moved\":1"), run.stderr_text);
    const std::string where = exec_blocking(
        schema.dsn, "SELECT tableoid::regclass::text FROM idempotency_record WHERE id = decode('" +
                        e2e::record_id_hex("partitioned", key_before) + "', 'hex')");
    BOOST_TEST(where.starts_with("idempotency_record_p"), where);

    check_replay(gateway, key_before, body_before, first_before);
    first_after = gateway.send(e2e::keyed_post("/payments", key_after, body_after));
    BOOST_TEST_REQUIRE(first_after.status == 201u, gateway.explain(first_after));
    BOOST_TEST(first_after.header("Idempotent-Replayed").value_or("") != "true");
    check_replay(gateway, key_after, body_after, first_after);
    BOOST_TEST(payments.counter("payment_posts") == 2u);
  }

  e2e::Gateway restarted(config);
  BOOST_TEST(contains(restarted.stderr_text(), "\"msg\":\"migrations applied\",\"applied\":0"),
             restarted.diagnostics());
  check_replay(restarted, key_before, body_before, first_before);
  check_replay(restarted, key_after, body_after, first_after);
  BOOST_TEST(payments.counter("payment_posts") == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
