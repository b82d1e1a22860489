// PgRecordStore, PgPool, PgConnection and the migrations against a real Postgres
// (IDEMGATE_PG_DSN; the suite fails when it is not set).
#define BOOST_TEST_MODULE record_store_pg
#include <libpq-fe.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gateway/core/errors.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_connection.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"
#include "tests/storage/pg_test_support.hpp"
#include "tests/storage/record_store_fixtures.hpp"

namespace idemgate::testing {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using namespace boost::asio::experimental::awaitable_operators;
using core::store_errc;
using storage::pg::Param;
using storage::pg::PgConnection;
using storage::pg::PgPool;

boost::system::error_code code(store_errc e) {
  return make_error_code(e);
}

struct PgBackend {
  explicit PgBackend(std::size_t connections = 2, std::chrono::milliseconds timeout = 5s)
      : pool(io.get_executor(), {pg_dsn(), connections, timeout, {}}), records(pool) {}

  core::RecordStore& store() { return records; }

  template <class T>
  T run(asio::awaitable<T> op) {
    return run_to_completion(io, std::move(op));
  }

  asio::awaitable<void> wait_until_expired(core::Sha256 id) {
    return wait_until_db_clock_passes_expiry(pool, id);
  }

  /// The server process behind the pool's connection (pool of one).
  int backend_pid() {
    auto rows = run(pool.query("SELECT pg_backend_pid()", {}));
    BOOST_TEST_REQUIRE(rows.has_value(), rows.error().message());
    return rows->int4(0, 0).value();
  }

  /// Whether a row with this id exists at all, expired or not.
  bool row_exists(const core::Sha256& id) {
    std::vector<Param> params;
    params.push_back(Param::bytes(bytes_of(id)));
    auto rows =
        run(pool.query("SELECT count(*) FROM idempotency_record WHERE id = $1", std::move(params)));
    BOOST_TEST_REQUIRE(rows.has_value(), rows.error().message());
    return rows->int8(0, 0).value() > 0;
  }

  asio::io_context io;
  PgPool pool;
  storage::pg::PgRecordStore records;
};

using RecordStoreBackends = std::tuple<PgBackend>;

asio::awaitable<std::optional<PgPool::Lease>> take(PgPool* pool) {
  auto lease = co_await pool->acquire(pool->deadline());
  if (!lease) co_return std::nullopt;
  co_return std::move(*lease);
}

asio::awaitable<boost::system::error_code> acquire_error(PgPool* pool) {
  auto lease = co_await pool->acquire(pool->deadline());
  co_return lease ? boost::system::error_code{} : lease.error();
}

asio::awaitable<boost::system::error_code> acquire_error_by(PgPool* pool,
                                                            storage::pg::Deadline deadline) {
  auto lease = co_await pool->acquire(deadline);
  co_return lease ? boost::system::error_code{} : lease.error();
}

asio::awaitable<int> acquire_pid(PgPool* pool) {
  auto lease = co_await pool->acquire(pool->deadline());
  co_return lease ? (*lease)->backend_pid() : -1;
}

/// Runs a long statement through the pool but stops waiting for it as soon as possible, the way
/// a caller racing the store against its own timer does.
asio::awaitable<bool> abandon_long_statement(PgPool* pool) {
  asio::steady_timer impatience(co_await asio::this_coro::executor, 0ms);
  auto winner = co_await (pool->query("SELECT pg_sleep(10)", {}) ||
                          impatience.async_wait(asio::as_tuple(asio::use_awaitable)));
  co_return winner.index() == 1;
}

}  // namespace idemgate::testing

using idemgate::testing::MigratedDatabase;
BOOST_TEST_GLOBAL_FIXTURE(MigratedDatabase);

#include "tests/storage/record_store_contract.hpp"  // the shared cases, run on PgBackend

BOOST_AUTO_TEST_SUITE(pg_record_store)

using namespace idemgate::testing;

BOOST_AUTO_TEST_CASE(spec_C25_stalled_insert_times_out_at_its_deadline_and_the_pool_recovers) {
  PgBackend backend(1, 300ms);
  const auto record = sample_record("stalled");
  const int pid_before = backend.backend_pid();

  // Another session inserts the same id and keeps its transaction open: our insert has to wait
  // for it, past our deadline.
  PgConnection blocker(backend.io.get_executor(), pg_dsn(), 60s);
  BOOST_TEST_REQUIRE(backend.run(blocker.connect(soon())).has_value(), blocker.last_error());
  BOOST_TEST_REQUIRE(backend.run(blocker.query("BEGIN", {}, soon())).has_value());
  std::vector<Param> params;
  params.push_back(Param::bytes(bytes_of(record.id)));
  params.push_back(Param::bytes(bytes_of(record.fingerprint)));
  auto held = backend.run(blocker.query(
      "INSERT INTO idempotency_record (id, route, fingerprint, status, headers, body, expires_at)"
      " VALUES ($1, 'blocker', $2, 200, '\\x01'::bytea, ''::bytea, now() + interval '1 hour')",
      std::move(params), soon()));
  BOOST_TEST_REQUIRE(held.has_value(), blocker.last_error());

  const auto started = std::chrono::steady_clock::now();
  auto stalled = backend.run(backend.store().insert(record, kLongTtl));
  const auto waited = std::chrono::steady_clock::now() - started;
  BOOST_TEST_REQUIRE(!stalled.has_value());
  BOOST_TEST(stalled.error() == code(store_errc::timed_out));
  // It returned by itself while the blocker still held the row, and not before its deadline.
  BOOST_TEST((waited >= backend.pool.options().operation_timeout));
  BOOST_TEST(backend.pool.open_connections() == 0u);  // the timed-out connection was discarded

  BOOST_TEST_REQUIRE(backend.run(blocker.query("ROLLBACK", {}, soon())).has_value());
  // The abandoned statement may have gone on to insert the record once the blocker let go:
  // either way the retry works and the stored record is ours.
  auto retried = backend.run(backend.store().insert(record, kLongTtl));
  BOOST_TEST_REQUIRE(retried.has_value(), retried.error().message());
  if (!retried->inserted) {
    BOOST_TEST_REQUIRE(retried->existing.has_value());
    check_same_response(*retried->existing, record);
  }
  BOOST_TEST(backend.backend_pid() != pid_before);
}

BOOST_AUTO_TEST_CASE(spec_C25_terminated_backend_is_replaced_by_a_new_connection) {
  PgBackend backend(1, 5s);
  const int pid_before = backend.backend_pid();

  PgConnection admin(backend.io.get_executor(), pg_dsn(), 60s);
  BOOST_TEST_REQUIRE(backend.run(admin.connect(soon())).has_value(), admin.last_error());
  std::vector<Param> params;
  params.push_back(Param::text(std::to_string(pid_before)));
  // With a timeout, pg_terminate_backend returns once the process is gone.
  auto killed = backend.run(
      admin.query("SELECT pg_terminate_backend($1::int4, 5000)", std::move(params), soon()));
  BOOST_TEST_REQUIRE(killed.has_value(), admin.last_error());
  BOOST_TEST_REQUIRE(killed->boolean(0, 0).value_or(false));

  // The first operation may still meet the dead connection; the next one must work.
  auto first = backend.run(backend.store().find(random_id()));
  BOOST_TEST_MESSAGE("first operation after termination: " << (first ? std::string("ok")
                                                                     : first.error().message()));
  auto second = backend.run(backend.store().find(random_id()));
  BOOST_TEST_REQUIRE(second.has_value(), second.error().message());
  BOOST_TEST(!second->has_value());
  BOOST_TEST(backend.backend_pid() != pid_before);
}

namespace {

/// The process's open socket descriptors (the listing's own directory descriptor is not one).
std::set<int> open_sockets() {
  std::set<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.string().starts_with("socket:")) {
      fds.insert(std::stoi(entry.path().filename().string()));
    }
  }
  return fds;
}

}  // namespace

// libpq closes its socket by itself when it finds the connection lost. The number is then free
// for the next socket the process opens (on a gateway, another io thread's client connection),
// and closing the lost connection must leave that socket's reactor registration alone: its
// reads must still be reported. (Seen in C43: a client connection accepted during the failover
// was never read, and was reset at header_read_timeout.)
BOOST_AUTO_TEST_CASE(a_lost_connection_leaves_alone_the_socket_that_reuses_its_number) {
  asio::io_context io;
  PgConnection admin(io.get_executor(), pg_dsn(), 60s);
  std::optional<PgConnection> lost(std::in_place, io.get_executor(), pg_dsn(), 60s);
  BOOST_TEST_REQUIRE(run_to_completion(io, admin.connect(soon())).has_value(), admin.last_error());
  BOOST_TEST_REQUIRE(run_to_completion(io, lost->connect(soon())).has_value(), lost->last_error());
  std::vector<Param> params;
  params.push_back(Param::text(std::to_string(lost->backend_pid())));
  auto killed = run_to_completion(
      io, admin.query("SELECT pg_terminate_backend($1::int4, 5000)", std::move(params), soon()));
  BOOST_TEST_REQUIRE(killed.has_value(), admin.last_error());
  BOOST_TEST_REQUIRE(killed->boolean(0, 0).value_or(false));

  const auto before = open_sockets();
  auto failed = run_to_completion(io, lost->query("SELECT 1", {}, soon()));
  BOOST_TEST_REQUIRE(!failed.has_value());
  BOOST_TEST(failed.error() == code(store_errc::unavailable));
  const auto after = open_sockets();
  std::vector<int> dropped;
  std::ranges::set_difference(before, after, std::back_inserter(dropped));
  BOOST_TEST_REQUIRE(dropped.size() == 1u, "libpq closed its socket on the lost connection");

  // New sockets take the lowest free numbers: one of the first few takes the dropped one.
  std::vector<std::pair<asio::local::stream_protocol::socket, asio::local::stream_protocol::socket>>
      pairs;
  std::optional<std::size_t> reuser;
  for (std::size_t i = 0; i < 8 && !reuser; ++i) {
    auto& pair = pairs.emplace_back(asio::local::stream_protocol::socket(io),
                                    asio::local::stream_protocol::socket(io));
    asio::local::connect_pair(pair.first, pair.second);
    if (pair.first.native_handle() == dropped.front()) reuser = i;
    if (pair.second.native_handle() == dropped.front()) {
      std::swap(pair.first, pair.second);
      reuser = i;
    }
  }
  BOOST_TEST_REQUIRE(reuser.has_value(), "no new socket took the dropped number");
  auto& [reader, writer] = pairs[*reuser];
  char byte = 0;
  bool read = false;
  reader.async_read_some(asio::buffer(&byte, 1),
                         [&](boost::system::error_code ec, std::size_t) { read = !ec; });
  io.poll();  // the read is now waiting for the reactor
  BOOST_TEST_REQUIRE(!read);

  lost.reset();  // the pool discards a lost connection so
  asio::write(writer, asio::buffer("x", 1));
  io.restart();
  io.run_for(5s);  // an event deadline: the read completes as soon as the reactor reports it
  BOOST_TEST(read, "the socket that reused the number was never reported readable");
  BOOST_TEST(byte == 'x');
}

// SPEC C43: a demoted primary answers writes with 25006 (read-only transaction). The connection
// then talks to a standby: it is broken (never back to the pool), and the error is unavailable
// (C25), so the pool reconnects to whichever host is primary now.
BOOST_AUTO_TEST_CASE(spec_C43_read_only_transaction_marks_the_connection_broken_and_unavailable) {
  boost::asio::io_context io;
  PgConnection connection(io.get_executor(), pg_dsn(), 60s);
  BOOST_TEST_REQUIRE(run_to_completion(io, connection.connect(soon())).has_value(),
                     connection.last_error());
  auto set =
      run_to_completion(io, connection.query("SET default_transaction_read_only = on", {}, soon()));
  BOOST_TEST_REQUIRE(set.has_value(), connection.last_error());
  BOOST_TEST(!connection.broken());
  auto write = run_to_completion(
      io, connection.query("CREATE TEMPORARY TABLE read_only_probe (x int)", {}, soon()));
  BOOST_TEST_REQUIRE(!write.has_value());
  BOOST_TEST(write.error() == code(store_errc::unavailable), write.error().message());
  BOOST_TEST(connection.last_error().starts_with("25006"), connection.last_error());
  BOOST_TEST(connection.broken());
}

// SPEC C44: behind PgBouncer's transaction pooling every statement may land on another server
// session, so with prepared_statements false the gateway leaves none behind: no named
// statement, no session setting. The default (true) prepares, which this test also shows.
BOOST_AUTO_TEST_CASE(spec_C44_without_prepared_statements_a_session_keeps_no_state) {
  for (const bool prepared : {false, true}) {
    boost::asio::io_context io;
    PgPool pool(io.get_executor(), {pg_dsn(), 1, 5s, {}, prepared});
    idemgate::storage::pg::PgRecordStore store(pool);
    const auto record = sample_record(prepared ? "prepared" : "unprepared");
    auto inserted = run_to_completion(io, store.insert(record, kLongTtl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
    BOOST_TEST(inserted->inserted);
    auto found = run_to_completion(io, store.find(record.id));
    BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
    BOOST_TEST(found->has_value());
    auto named =
        run_to_completion(io, pool.query("SELECT count(*) FROM pg_prepared_statements", {}));
    BOOST_TEST_REQUIRE(named.has_value(), named.error().message());
    auto timeout = run_to_completion(
        io, pool.query("SELECT current_setting('statement_timeout') = "
                       "(SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout')",
                       {}));
    BOOST_TEST_REQUIRE(timeout.has_value(), timeout.error().message());
    if (prepared) {
      BOOST_TEST(named->int8(0, 0).value() > 0);
      BOOST_TEST(!timeout->boolean(0, 0).value(), "the session's statement_timeout is set");
    } else {
      BOOST_TEST(named->int8(0, 0).value() == 0);
      BOOST_TEST(timeout->boolean(0, 0).value(), "statement_timeout is the server's own");
    }
  }
}

// A prepared lookup's generic plan is made after its first executions: on a table that was
// empty then (a fresh deployment) it is a sequential scan, or a walk of the expires_at index,
// kept as the table grows until the next ANALYZE. The request pools' sessions plan both
// lookups (one id, a batch of ids) on the primary key whatever the table's size.
BOOST_AUTO_TEST_CASE(key_lookups_plan_the_primary_key_even_on_an_empty_table) {
  struct Lookup {
    bool batched;
    const char* explain;
  };
  for (const Lookup lookup : {Lookup{false, "EXPLAIN EXECUTE idemgate_find_record('\\x00')"},
                              Lookup{true, "EXPLAIN EXECUTE idemgate_find_record_batch('{}')"}}) {
    for (const bool key_plans : {false, true}) {
      boost::asio::io_context io;
      PgPool::Options options{pg_dsn(), 1, 5s, {}};
      options.key_plans = key_plans;
      PgPool pool(io.get_executor(), options);
      idemgate::storage::pg::PgRecordStore::Options store_options;
      store_options.batch_lookups = lookup.batched;
      idemgate::storage::pg::PgRecordStore store(pool, io.get_executor(), store_options);
      // One connection, so one session: its temporary table hides the shared one, and the
      // plan is the generic one, as after a statement's first five executions.
      for (const char* sql :
           {"CREATE TEMPORARY TABLE idempotency_record"
            " (LIKE public.idempotency_record INCLUDING ALL)",
            "ANALYZE pg_temp.idempotency_record", "SET plan_cache_mode = force_generic_plan"}) {
        auto done = run_to_completion(io, pool.query(sql, {}));
        BOOST_TEST_REQUIRE(done.has_value(), done.error().message());
      }
      auto found = run_to_completion(io, store.find(random_id()));  // prepares the lookup
      BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
      BOOST_TEST(!found->has_value());
      auto plan = run_to_completion(io, pool.query(lookup.explain, {}));
      BOOST_TEST_REQUIRE(plan.has_value(), plan.error().message());
      std::string text;
      for (int row = 0; row < plan->rows(); ++row) text += std::string(plan->bytes(row, 0)) + "\n";
      if (key_plans) {
        BOOST_TEST(text.find("idempotency_record_pkey") != std::string::npos, text);
        BOOST_TEST(text.find("Seq Scan") == std::string::npos, text);
        BOOST_TEST(text.find("expires_at_idx") == std::string::npos, text);
      } else {
        BOOST_TEST(text.find("Seq Scan") != std::string::npos, text);
      }
    }
  }
}

// The planner prices a statement's custom plan for a short array of ids below its generic plan,
// so without the request sessions' plan_cache_mode it would plan the batched lookup and insert
// again at every execution (a seventh of Postgres's CPU per new key in S3, bench/RESULTS.md).
BOOST_AUTO_TEST_CASE(batched_lookups_and_inserts_keep_one_generic_plan) {
  boost::asio::io_context io;
  PgPool::Options options{pg_dsn(), 1, 5s, {}};
  options.key_plans = true;
  PgPool pool(io.get_executor(), options);
  idemgate::storage::pg::PgRecordStore store(
      pool, io.get_executor(), idemgate::storage::pg::PgRecordStore::with_group_commit());
  constexpr int kExecutions = 8;
  for (int i = 0; i < kExecutions; ++i) {
    const auto record = sample_record("plan-" + std::to_string(i));
    auto inserted = run_to_completion(io, store.insert(record, kLongTtl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
    auto found = run_to_completion(io, store.find(record.id));
    BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
    BOOST_TEST(found->has_value());
  }
  auto plans = run_to_completion(
      io, pool.query("SELECT name, custom_plans, generic_plans FROM pg_prepared_statements"
                     " WHERE name IN ('idemgate_find_record_batch',"
                     " 'idemgate_insert_record_batch') ORDER BY name",
                     {}));
  BOOST_TEST_REQUIRE(plans.has_value(), plans.error().message());
  BOOST_TEST_REQUIRE(plans->rows() == 2);
  for (int row = 0; row < plans->rows(); ++row) {
    const std::string name(plans->bytes(row, 0));
    BOOST_TEST(plans->int8(row, 1).value() == 0, name << " custom plans");
    BOOST_TEST(plans->int8(row, 2).value() >= kExecutions, name << " generic plans");
  }
}

BOOST_AUTO_TEST_CASE(connection_abandoned_mid_operation_is_discarded_not_reused) {
  PgBackend backend(1, 60s);
  const int pid_before = backend.backend_pid();

  BOOST_TEST_REQUIRE(backend.run(abandon_long_statement(&backend.pool)));
  BOOST_TEST(backend.pool.open_connections() == 0u);
  BOOST_TEST(backend.backend_pid() != pid_before);
}

BOOST_AUTO_TEST_CASE(spec_C25_unreachable_server_reports_unavailable) {
  boost::asio::io_context io;
  // A port that was free a moment ago: connecting to it is refused.
  boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::address_v4::loopback(), 0});
  const auto port = probe.local_endpoint().port();
  probe.close();
  PgPool pool(io.get_executor(),
              {"postgresql://idem@127.0.0.1:" + std::to_string(port) + "/idem", 1, 5s, {}});
  idemgate::storage::pg::PgRecordStore store(pool);

  auto found = run_to_completion(io, store.find(random_id()));
  BOOST_TEST_REQUIRE(!found.has_value());
  BOOST_TEST(found.error() == code(store_errc::unavailable));
  BOOST_TEST(pool.open_connections() == 0u);
}

// SPEC C25: while connecting fails, a pool sends one connect attempt at a time, not one per
// waiting caller. This server accepts TCP connections and never answers, so each attempt lasts
// until its deadline: the callers that arrive meanwhile wait for that one attempt and fail with
// it, by their own deadline.
BOOST_AUTO_TEST_CASE(spec_C25_a_failing_store_gets_one_connect_attempt_at_a_time) {
  boost::asio::io_context io;
  // Listens (the kernel completes the handshakes) but never accepts.
  boost::asio::ip::tcp::acceptor silent(io, {boost::asio::ip::address_v4::loopback(), 0});
  const auto port = silent.local_endpoint().port();
  PgPool pool(io.get_executor(),
              {"postgresql://idem@127.0.0.1:" + std::to_string(port) + "/idem", 8, 300ms, {}});

  BOOST_TEST(run_to_completion(io, acquire_error(&pool)) == code(store_errc::timed_out));
  BOOST_TEST_REQUIRE(pool.connect_attempts() == 1u);

  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + 300ms;
  std::vector<boost::system::error_code> errors;
  for (int i = 0; i < 8; ++i) {
    boost::asio::co_spawn(io, acquire_error_by(&pool, deadline),
                          [&](std::exception_ptr e, boost::system::error_code ec) {
                            if (e) std::rethrow_exception(e);
                            errors.push_back(ec);
                          });
  }
  io.restart();
  io.run();
  const auto took = std::chrono::steady_clock::now() - started;
  BOOST_TEST(errors.size() == 8u);
  for (const auto& ec : errors) {
    BOOST_TEST((ec == code(store_errc::unavailable) || ec == code(store_errc::timed_out)),
               ec.message());
  }
  BOOST_TEST(pool.connect_attempts() == 2u,
             "eight callers made " << pool.connect_attempts() - 1 << " attempts");
  BOOST_TEST(pool.open_connections() == 0u);
  BOOST_TEST_MESSAGE("eight callers ended after "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                     << " ms");
}

// SPEC C46: each new connection reports the server it reached to the pool's tracker. The tracker
// here has seen another host before, so the first connection is a switch and the second, to the
// same server, is not.
BOOST_AUTO_TEST_CASE(spec_C46_new_connections_report_their_server_to_the_tracker) {
  boost::asio::io_context io;
  std::vector<std::string> switched;
  auto tracker = std::make_shared<idemgate::core::PrimaryTracker>(
      [&](const std::string& from, const std::string& to) { switched.push_back(from + ">" + to); });
  PgPool::Options options{pg_dsn(), 2, 5s, {}};
  options.tracker = tracker;
  PgPool pool(io.get_executor(), options);
  tracker->use({}, "198.51.100.1:5432");  // as if another pool had used another host

  auto a = run_to_completion(io, take(&pool));
  auto b = run_to_completion(io, take(&pool));
  BOOST_TEST_REQUIRE((a && b));
  BOOST_TEST(pool.connect_attempts() == 2u);
  auto port = run_to_completion(io, (*a)->query("SELECT inet_server_port()", {}, soon()));
  BOOST_TEST_REQUIRE(port.has_value(), (*a)->last_error());
  const std::string address = (*a)->server_address();
  BOOST_TEST(address == (*b)->server_address());
  // The port as the server sees it (NULL over a Unix socket, which the DSN may name too).
  if (!port->is_null(0, 0)) {
    BOOST_TEST(address.ends_with(":" + std::to_string(port->int4(0, 0).value())), address);
  }
  BOOST_TEST(address.find(':') > 0u, address);
  BOOST_TEST(tracker->switches() == 1u);
  BOOST_TEST(switched == std::vector<std::string>{"198.51.100.1:5432>" + address},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(pool_acquire_times_out_while_every_connection_is_in_use) {
  PgBackend backend(1, 300ms);
  auto held = backend.run(take(&backend.pool));
  BOOST_TEST_REQUIRE(held.has_value());

  auto waited = backend.run(acquire_error(&backend.pool));
  BOOST_TEST(waited == code(store_errc::timed_out));
  BOOST_TEST(backend.pool.open_connections() == 1u);
}

BOOST_AUTO_TEST_CASE(pool_hands_a_returned_connection_to_the_waiting_caller) {
  PgBackend backend(1, 5s);
  auto held = backend.run(take(&backend.pool));
  BOOST_TEST_REQUIRE(held.has_value());
  const int pid = (*held)->backend_pid();

  std::optional<int> waiter_pid;
  std::exception_ptr failure;
  boost::asio::co_spawn(backend.io, acquire_pid(&backend.pool), [&](std::exception_ptr e, int got) {
    if (e) {
      failure = e;
    } else {
      waiter_pid = got;
    }
  });
  backend.io.restart();
  backend.io.poll();  // the waiter starts and queues for the only connection
  BOOST_TEST_REQUIRE(!waiter_pid.has_value());

  held.reset();  // gives the connection back
  backend.io.restart();
  backend.io.run();
  if (failure) std::rethrow_exception(failure);
  BOOST_TEST_REQUIRE(waiter_pid.has_value());
  BOOST_TEST(*waiter_pid == pid);
}

BOOST_AUTO_TEST_CASE(spec_C16_eight_mebibyte_body_round_trips) {
  // Larger than the socket buffers: the statement goes out over several writes (PQflush loop).
  PgBackend backend;
  auto record = sample_record("large");
  record.response.body.resize(8 * 1024 * 1024);
  for (std::size_t i = 0; i < record.response.body.size(); ++i) {
    record.response.body[i] = static_cast<char>((i * 131) ^ (i >> 9));
  }
  auto inserted = backend.run(backend.store().insert(record, kLongTtl));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  BOOST_TEST(inserted->inserted);

  auto found = backend.run(backend.store().find(record.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  BOOST_TEST_REQUIRE((*found)->response.body.size() == record.response.body.size());
  BOOST_TEST(((*found)->response.body == record.response.body));
}

BOOST_AUTO_TEST_CASE(pool_discards_a_connection_returned_inside_a_transaction) {
  PgBackend backend(1, 5s);
  int pid_before = 0;
  {
    auto held = backend.run(take(&backend.pool));
    BOOST_TEST_REQUIRE(held.has_value());
    pid_before = (*held)->backend_pid();
    auto began = backend.run((*held)->query("BEGIN", {}, soon()));
    BOOST_TEST_REQUIRE(began.has_value(), (*held)->last_error());
  }
  BOOST_TEST(backend.backend_pid() != pid_before);
}

BOOST_AUTO_TEST_CASE(find_reports_a_malformed_row_as_a_protocol_error) {
  PgBackend backend;
  const auto id = random_id();
  std::vector<Param> params;
  params.push_back(Param::bytes(bytes_of(id)));
  auto written = backend.run(backend.pool.query(
      "INSERT INTO idempotency_record (id, route, fingerprint, status, headers, body, expires_at)"
      " VALUES ($1, 'bad', $1, 200, '\\x02'::bytea, ''::bytea, now() + interval '1 hour')",
      std::move(params)));
  BOOST_TEST_REQUIRE(written.has_value(), written.error().message());

  auto found = backend.run(backend.store().find(id));
  BOOST_TEST_REQUIRE(!found.has_value());
  BOOST_TEST(found.error() == code(store_errc::protocol));
}

BOOST_AUTO_TEST_CASE(spec_C24_delete_expired_removes_only_expired_rows_in_batches) {
  PgBackend backend;
  std::vector<idemgate::core::StoredRecord> expired;
  std::vector<idemgate::core::StoredRecord> live;
  for (int i = 0; i < 5; ++i) {
    expired.push_back(sample_record("expired-" + std::to_string(i)));
    auto inserted = backend.run(backend.store().insert(expired.back(), 1ms));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  }
  for (int i = 0; i < 2; ++i) {
    live.push_back(sample_record("live-" + std::to_string(i)));
    auto inserted = backend.run(backend.store().insert(live.back(), kLongTtl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  }
  // Inserted last, the last expired row expires last.
  backend.run(backend.wait_until_expired(expired.back().id));

  std::vector<std::int64_t> batches;
  for (int round = 0; round < 10'000; ++round) {
    auto deleted = backend.run(backend.records.delete_expired(2));
    BOOST_TEST_REQUIRE(deleted.has_value(), deleted.error().message());
    BOOST_TEST_REQUIRE(*deleted <= 2);
    batches.push_back(*deleted);
    if (*deleted == 0) break;
  }
  BOOST_TEST_REQUIRE(batches.size() >= 4u);  // five rows, two per batch, then nothing
  BOOST_TEST(batches.front() == 2);
  BOOST_TEST(batches.back() == 0);

  for (const auto& record : expired) BOOST_TEST(!backend.row_exists(record.id));
  for (const auto& record : live) {
    auto found = backend.run(backend.store().find(record.id));
    BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
    BOOST_TEST(found->has_value());
  }
}

BOOST_AUTO_TEST_CASE(purge_deletes_a_live_or_expired_record_and_reports_whether_there_was_one) {
  PgBackend backend;
  const auto live = sample_record("purge-live");
  const auto expired = sample_record("purge-expired");
  const auto other = sample_record("purge-other");
  for (const auto* record : {&live, &other}) {
    auto inserted = backend.run(backend.store().insert(*record, kLongTtl));
    BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  }
  auto inserted = backend.run(backend.store().insert(expired, 1ms));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  backend.run(backend.wait_until_expired(expired.id));

  for (const auto* record : {&live, &expired}) {
    auto purged = backend.run(backend.records.purge(record->id));
    BOOST_TEST_REQUIRE(purged.has_value(), purged.error().message());
    BOOST_TEST(*purged);
    BOOST_TEST(!backend.row_exists(record->id));
    auto again = backend.run(backend.records.purge(record->id));
    BOOST_TEST_REQUIRE(again.has_value(), again.error().message());
    BOOST_TEST(!*again);
  }
  BOOST_TEST(backend.row_exists(other.id));  // only the id named is deleted
}

BOOST_AUTO_TEST_CASE(migrations_applied_twice_apply_nothing_the_second_time) {
  ScratchSchema schema;
  const auto count = static_cast<int>(idemgate::storage::pg::embedded_migrations().size());
  BOOST_TEST_REQUIRE(count >= 1);

  auto first = idemgate::storage::pg::apply_migrations(schema.dsn);
  BOOST_TEST_REQUIRE(first.has_value(), first.error().message());
  BOOST_TEST(*first == count);
  auto second = idemgate::storage::pg::apply_migrations(schema.dsn);
  BOOST_TEST_REQUIRE(second.has_value(), second.error().message());
  BOOST_TEST(*second == 0);

  BOOST_TEST(exec_blocking(pg_dsn(), "SELECT to_regclass('" + schema.name +
                                         ".idempotency_record') IS NOT NULL") == "t");
  BOOST_TEST(exec_blocking(pg_dsn(), "SELECT count(*) FROM " + schema.name +
                                         ".schema_migrations") == std::to_string(count));
}

BOOST_AUTO_TEST_CASE(concurrent_migrations_apply_each_version_exactly_once) {
  ScratchSchema schema;
  const auto count = static_cast<int>(idemgate::storage::pg::embedded_migrations().size());
  std::vector<boost::system::result<int>> outcomes(4, idemgate::core::store_errc::protocol);
  std::vector<std::thread> gateways;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    gateways.emplace_back(
        [&, i] { outcomes[i] = idemgate::storage::pg::apply_migrations(schema.dsn); });
  }
  for (auto& gateway : gateways) gateway.join();

  int applied = 0;
  for (const auto& outcome : outcomes) {
    BOOST_TEST_REQUIRE(outcome.has_value(), outcome.error().message());
    applied += *outcome;
  }
  BOOST_TEST(applied == count);
  BOOST_TEST(exec_blocking(pg_dsn(), "SELECT count(*) FROM " + schema.name +
                                         ".schema_migrations") == std::to_string(count));
}

BOOST_AUTO_TEST_SUITE_END()
