// Record inserts through PgRecordStore at a fixed concurrency, with and without group commit:
// the S2 lever measured without HTTP, side by side with pgbench's single-row insert.
//
//   store_insert_bench --dsn DSN --threads T --concurrency C --seconds S
//                      [--pool N] [--group-commit [--max-in-flight K]]
//
// Each of T threads runs its own io_context, PgPool (N connections, default C/T) and
// PgRecordStore, as the gateway does; C coroutines in all insert fresh records (the gateway's
// record shape: a 201 with Location and a small JSON body) back to back for S seconds. Prints one
// line:
//   inserts=N seconds=S tps=X p50_ms=… p99_ms=… batches=B rows=R errors=E
#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/tool_support.hpp"
#include "gateway/core/hash.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"

namespace {

namespace asio = boost::asio;
using namespace idemgate;
using Clock = std::chrono::steady_clock;

struct Totals {
  std::atomic<std::uint64_t> inserts{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> batches{0};
  std::atomic<std::uint64_t> rows{0};
};

core::StoredRecord make_record(const std::string& tag) {
  core::StoredRecord record;
  record.id = core::Sha256Builder().field(tag).finish();
  record.route = "payments";
  record.fingerprint = core::Sha256Builder().field("fp").field(tag).finish();
  record.response.status = 201;
  record.response.headers = {{"Content-Type", "application/json"},
                             {"Location", "/payments/" + tag}};
  record.response.body = "{\"id\":\"" + tag + "\",\"status\":\"created\"}";
  return record;
}

asio::awaitable<void> inserter(storage::pg::PgRecordStore* store, std::string prefix,
                               Clock::time_point until, Totals* totals,
                               std::vector<double>* latencies_ms) {
  for (std::uint64_t n = 0; Clock::now() < until; ++n) {
    const auto started = Clock::now();
    auto inserted =
        co_await store->insert(make_record(prefix + std::to_string(n)), std::chrono::hours(1));
    const std::chrono::duration<double, std::milli> took = Clock::now() - started;
    if (inserted && inserted->inserted) {
      totals->inserts.fetch_add(1, std::memory_order_relaxed);
      latencies_ms->push_back(took.count());
    } else {
      totals->errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string dsn;
  int threads = 2;
  int concurrency = 32;
  double seconds = 10;
  bool group_commit = false;
  std::size_t max_in_flight = 2;
  std::size_t pool_size = 0;
  po::options_description options("store_insert_bench");
  options.add_options()("dsn", po::value(&dsn)->required(), "Postgres DSN")(
      "threads", po::value(&threads), "io threads")("concurrency", po::value(&concurrency),
                                                    "concurrent inserters, over all threads")(
      "seconds", po::value(&seconds), "duration")("group-commit", po::bool_switch(&group_commit),
                                                  "route inserts through PgBatchWriter")(
      "max-in-flight", po::value(&max_in_flight), "batches out at once per thread")(
      "pool", po::value(&pool_size), "Postgres connections per thread (0: one per inserter)");
  if (!idemgate::bench::parse_options(argc, argv, options)) return 2;
  threads = std::max(1, threads);
  concurrency = std::max(threads, concurrency);
  if (auto applied = storage::pg::apply_migrations(dsn); !applied) {
    std::cerr << "migrations: " << applied.error().message() << "\n";
    return 1;
  }

  Totals totals;
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(threads));
  const std::string run = core::random_token().substr(0, 8);
  const auto started = Clock::now();
  const auto until =
      started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      asio::io_context io;
      const int mine = concurrency / threads + (t < concurrency % threads ? 1 : 0);
      storage::pg::PgPool::Options pool_options;
      pool_options.dsn = dsn;
      pool_options.max_connections = pool_size > 0 ? pool_size : static_cast<std::size_t>(mine);
      storage::pg::PgPool pool(io.get_executor(), pool_options);
      storage::pg::PgRecordStore::Options store_options;
      store_options.group_commit = group_commit;
      store_options.batch.max_in_flight = max_in_flight;
      storage::pg::PgRecordStore store(pool, io.get_executor(), store_options);
      for (int c = 0; c < mine; ++c) {
        const std::string prefix = run + "-" + std::to_string(t) + "-" + std::to_string(c) + "-";
        asio::co_spawn(io, inserter(&store, prefix, until, &totals, &latencies[t]),
                       [](std::exception_ptr e) {
                         if (e) std::rethrow_exception(e);
                       });
      }
      io.run();
      if (const auto* writer = store.batch_writer()) {
        totals.batches += writer->batches_sent();
        totals.rows += writer->rows_sent();
      }
    });
  }
  for (auto& w : workers) w.join();
  const std::chrono::duration<double> elapsed = Clock::now() - started;

  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  const auto inserts = totals.inserts.load();
  std::printf(
      "inserts=%llu seconds=%.2f tps=%.0f p50_ms=%.2f p99_ms=%.2f batches=%llu rows=%llu "
      "errors=%llu\n",
      static_cast<unsigned long long>(inserts), elapsed.count(),
      static_cast<double>(inserts) / elapsed.count(), idemgate::bench::percentile(all, 0.50),
      idemgate::bench::percentile(all, 0.99),
      static_cast<unsigned long long>(totals.batches.load()),
      static_cast<unsigned long long>(totals.rows.load()),
      static_cast<unsigned long long>(totals.errors.load()));
  return totals.errors.load() == 0 ? 0 : 1;
}
