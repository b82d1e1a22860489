#define BOOST_TEST_MODULE redis_lock_redis_test
#include <boost/asio/ip/tcp.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "storage/redis/redis_connection.hpp"
#include "storage/redis/redis_lock.hpp"
#include "tests/storage/lock_service_contract.hpp"
#include "tests/storage/redis_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using idemgate::core::store_errc;
using idemgate::storage::redis::RedisClient;
using idemgate::storage::redis::RedisConnection;
using idemgate::storage::redis::RedisLock;
using idemgate::storage::redis::Reply;
using idemgate::test::reply_of;
using idemgate::test::lock_service_contract::expect;
using idemgate::test::lock_service_contract::random_id;
using idemgate::test::lock_service_contract::require;
using idemgate::test::lock_service_contract::value_of;

using idemgate::test::IgnoreSigpipe;
BOOST_TEST_GLOBAL_FIXTURE(IgnoreSigpipe);

namespace {

struct RedisLockFixture {
  asio::io_context io;
  RedisConnection connection{io.get_executor(), idemgate::test::redis_options_from_env()};
  RedisClient client{connection};
  RedisLock redis_lock{client};

  idemgate::core::LockService& lock() { return redis_lock; }
  void run(asio::awaitable<void> body) { idemgate::test::run_one(io, std::move(body)); }
  asio::awaitable<void> let_time_pass(std::chrono::milliseconds d) {
    co_await idemgate::test::sleep_for(io.get_executor(), d);
  }
};

/// A second connection for poking at the server (CLIENT PAUSE, CLIENT KILL) while the one under
/// test is in use.
struct SideFixture {
  asio::io_context io;
  RedisConnection side{io.get_executor(), idemgate::test::redis_options_from_env()};

  idemgate::config::Redis options_with_timeout(std::chrono::milliseconds timeout) {
    auto options = idemgate::test::redis_options_from_env();
    options.operation_timeout = timeout;
    return options;
  }
};

/// Awaits a command that must answer +OK.
asio::awaitable<void> require_ok(asio::awaitable<boost::system::result<Reply>> op) {
  const auto reply = co_await reply_of(std::move(op));
  BOOST_REQUIRE_MESSAGE(reply.is_status("OK"), "expected OK, got " << reply.str);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(redis_lock_contract)
IDEMGATE_LOCK_SERVICE_CONTRACT(RedisLockFixture)
BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(redis_lock)

BOOST_FIXTURE_TEST_CASE(spec_C23_lock_key_is_built_from_the_id_hash, RedisLockFixture) {
  const auto id = random_id();
  const auto key = RedisLock::key_of(id);
  BOOST_TEST(key == "idemgate:lock:" + idemgate::core::to_hex(id));
  run([](RedisLockFixture* f, idemgate::core::Sha256 lock_id) -> asio::awaitable<void> {
    co_await require(f->redis_lock.try_acquire(lock_id, "owner-a", 30s), true, "a acquires");
    const auto stored = co_await reply_of(f->connection.command("GET", RedisLock::key_of(lock_id)));
    BOOST_TEST(stored.str == "owner-a");
    const auto pttl = co_await reply_of(f->connection.command("PTTL", RedisLock::key_of(lock_id)));
    BOOST_TEST(pttl.integer > 0);
    BOOST_TEST(pttl.integer <= 30000);
  }(this, id));
}

BOOST_FIXTURE_TEST_CASE(scripts_are_loaded_again_after_the_script_cache_is_flushed,
                        RedisLockFixture) {
  run([](RedisLockFixture* f) -> asio::awaitable<void> {
    const auto id = random_id();
    co_await require(f->redis_lock.try_acquire(id, "owner-a", 30s), true, "a acquires");
    co_await require(f->redis_lock.renew(id, "owner-a", 30s), true, "a renews (loads script)");
    co_await require_ok(f->connection.command("SCRIPT", "FLUSH"));
    // EVALSHA now answers NOSCRIPT; the lock falls back to EVAL.
    co_await expect(f->redis_lock.renew(id, "owner-a", 30s), true, "a renews after flush");
    co_await require_ok(f->connection.command("SCRIPT", "FLUSH"));
    co_await expect(f->redis_lock.release(id, "owner-a"), true, "a releases after flush");
  }(this));
}

// SPEC C41: with wait_replicas, a lock no replica acknowledged does not count as taken. The test
// server has no replica, so WAIT 1 answers 0: acquire fails as unavailable and the key is free.
BOOST_FIXTURE_TEST_CASE(spec_C41_a_lock_without_enough_replica_acks_is_released_and_fails,
                        RedisLockFixture) {
  RedisLock waiting{client, {.wait_replicas = 1, .wait_timeout = 200ms}};
  run([](RedisLockFixture* f, RedisLock* l) -> asio::awaitable<void> {
    const auto id = random_id();
    auto taken = co_await l->try_acquire(id, "owner-w", 30s);
    BOOST_REQUIRE(!taken);
    BOOST_TEST((taken.error() == store_errc::unavailable));
    const auto stored = co_await reply_of(f->connection.command("EXISTS", RedisLock::key_of(id)));
    BOOST_TEST(stored.integer == 0, "the unacknowledged lock was released");
    // With wait_replicas 0 the same server grants it (WAIT is not sent).
    co_await require(f->redis_lock.try_acquire(id, "owner-x", 30s), true, "x acquires");
  }(this, &waiting));
}

// SPEC C25: an operation past operation_timeout (a server that does not answer) ends with
// timed_out at its deadline, and the store is usable again without a restart. The server is
// made unresponsive with CLIENT PAUSE WRITE, whose OK tells when the pause is in force (DEBUG
// SLEEP is refused by Redis 7's default enable-debug-command=no, and racing it would need a
// sleep). The pause ends by the CLIENT UNPAUSE below, sent once the call has returned, so a call
// that returns at all was ended by its deadline, not by the server waking.
BOOST_FIXTURE_TEST_CASE(spec_C25_operation_past_timeout_is_timed_out_and_next_call_reconnects,
                        SideFixture) {
  static constexpr auto kTimeout = 200ms;
  // Only a safety net: were the call to wait for the server, the pause would lift itself after
  // this and the call would then succeed, which fails the case instead of hanging it.
  static constexpr auto kPause = 60s;
  RedisConnection connection{io.get_executor(), options_with_timeout(kTimeout)};
  RedisClient client{connection};
  RedisLock lock{client};
  idemgate::test::run_one(
      io, [](SideFixture* f, RedisConnection* conn, RedisLock* l) -> asio::awaitable<void> {
        co_await require(l->try_acquire(random_id(), "owner-a", 30s), true, "acquire before pause");
        BOOST_REQUIRE_EQUAL(conn->connect_count(), 1u);

        const auto pause_ms = std::to_string(std::chrono::milliseconds(kPause).count());
        co_await require_ok(f->side.command("CLIENT", "PAUSE", pause_ms, "WRITE"));
        const auto started = std::chrono::steady_clock::now();
        auto during = co_await l->try_acquire(random_id(), "owner-a", 30s);
        const auto elapsed = std::chrono::steady_clock::now() - started;
        // Unpause before judging, so a failed check leaves the server usable.
        co_await require_ok(f->side.command("CLIENT", "UNPAUSE"));

        BOOST_REQUIRE(!during.has_value());
        BOOST_CHECK(during.error() == store_errc::timed_out);
        BOOST_CHECK(elapsed >= kTimeout);  // the deadline was not cut short

        co_await expect(l->try_acquire(random_id(), "owner-a", 30s), true, "acquire after unpause");
        // Reconnected by itself (the timed-out acquire's undo opens a connection at once, and
        // opens another should that one meet the pause too).
        BOOST_CHECK_GE(conn->connect_count(), 2u);
      }(this, &connection, &lock));
}

// All commands pipelined on a connection that times out end with timed_out (none waits for a
// reply that would now be matched to the wrong command). Each of those SETs may still run when
// the server resumes (SPEC C25): their tokens are deleted once it answers again.
BOOST_FIXTURE_TEST_CASE(spec_C25_every_command_in_flight_on_a_timed_out_connection_is_timed_out,
                        SideFixture) {
  constexpr int kInFlight = 5;
  RedisConnection connection{io.get_executor(), options_with_timeout(200ms)};
  RedisClient client{connection};
  RedisLock lock{client};
  idemgate::test::run_one(io, [](SideFixture* f) -> asio::awaitable<void> {
    co_await require_ok(f->side.command("CLIENT", "PAUSE", "20000", "WRITE"));
  }(this));

  std::vector<idemgate::core::Sha256> ids;
  std::vector<std::optional<boost::system::result<bool>>> results(kInFlight);
  std::vector<asio::awaitable<void>> bodies;
  for (auto& slot : results) {
    ids.push_back(random_id());
    bodies.push_back([](RedisLock* l, idemgate::core::Sha256 id,
                        std::optional<boost::system::result<bool>>* out) -> asio::awaitable<void> {
      *out = co_await l->try_acquire(id, "owner-a", 30s);
    }(&lock, ids.back(), &slot));
  }
  idemgate::test::run_all(io, std::move(bodies));
  for (const auto& r : results) {
    BOOST_REQUIRE(r.has_value());
    BOOST_REQUIRE(!r->has_value());
    BOOST_CHECK(r->error() == store_errc::timed_out);
  }
  BOOST_CHECK_EQUAL(connection.pending_undos(), static_cast<std::size_t>(kInFlight));

  idemgate::test::run_one(io, [](SideFixture* f) -> asio::awaitable<void> {
    co_await require_ok(f->side.command("CLIENT", "UNPAUSE"));
  }(this));
  idemgate::test::run_one(
      io,
      [](SideFixture* f, RedisConnection* conn, RedisLock* l,
         std::vector<idemgate::core::Sha256> all) -> asio::awaitable<void> {
        const bool undone = co_await idemgate::test::eventually(
            f->io.get_executor(), [conn] { return conn->pending_undos() == 0; });
        BOOST_CHECK_MESSAGE(undone, conn->pending_undos() << " undos still pending");
        for (const auto& id : all) {
          const auto left = co_await reply_of(f->side.command("EXISTS", RedisLock::key_of(id)));
          BOOST_CHECK_MESSAGE(left.integer == 0, "a lock taken by a timed-out SET is left");
        }
        co_await expect(l->try_acquire(random_id(), "owner-a", 30s), true, "acquire after unpause");
      }(this, &connection, &lock, ids));
}

// SPEC C25: a connection the server dropped is replaced by the next calls, with no restart.
BOOST_FIXTURE_TEST_CASE(spec_C25_reconnects_after_the_server_killed_the_connection, SideFixture) {
  RedisConnection connection{io.get_executor(), options_with_timeout(5s)};
  RedisClient client{connection};
  RedisLock lock{client};
  idemgate::test::run_one(
      io, [](SideFixture* f, RedisConnection* conn, RedisLock* l) -> asio::awaitable<void> {
        co_await require(l->try_acquire(random_id(), "owner-a", 30s), true, "acquire before kill");

        const auto killed =
            co_await reply_of(f->side.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"));
        BOOST_REQUIRE(killed.kind == Reply::Kind::integer);
        BOOST_REQUIRE_GE(killed.integer, 1);

        // The first call may still go out on the dead connection before its EOF was read; then it
        // reports unavailable (never a hang, never a wrong answer).
        auto first = co_await l->try_acquire(random_id(), "owner-a", 30s);
        if (!first) BOOST_CHECK(first.error() == store_errc::unavailable);
        if (!first) first = co_await l->try_acquire(random_id(), "owner-a", 30s);
        BOOST_CHECK(value_of(first));
        BOOST_CHECK_EQUAL(conn->connect_count(), 2u);
      }(this, &connection, &lock));
}

// SPEC C25: Redis down (nothing listening) → unavailable at once, not at the deadline; every
// call tries to connect again.
BOOST_AUTO_TEST_CASE(spec_C25_nothing_listening_is_unavailable_before_the_deadline) {
  asio::io_context io;
  // A bound socket that does not listen: connects to its port are refused, and no other
  // process can take the port meanwhile.
  asio::ip::tcp::acceptor placeholder(io);
  placeholder.open(asio::ip::tcp::v4());
  placeholder.bind({asio::ip::make_address("127.0.0.1"), 0});

  auto options = idemgate::test::redis_options_from_env();
  options.address = "127.0.0.1";
  options.port = placeholder.local_endpoint().port();
  options.operation_timeout = 60s;
  RedisConnection connection{io.get_executor(), options};
  RedisClient client{connection};
  RedisLock lock{client};
  idemgate::test::run_one(io, [](RedisConnection* conn, RedisLock* l) -> asio::awaitable<void> {
    for (int attempt = 1; attempt <= 2; ++attempt) {
      auto r = co_await l->try_acquire(random_id(), "owner-a", 30s);
      BOOST_REQUIRE(!r.has_value());
      // unavailable, not timed_out: the refusal ended it, not the 60 s deadline.
      BOOST_CHECK(r.error() == store_errc::unavailable);
      BOOST_CHECK_EQUAL(conn->connect_count(), static_cast<unsigned>(attempt));
    }
  }(&connection, &lock));
}

// Several coroutines share one connection: their commands are pipelined and each gets its own
// reply (SPEC C19 depends on many requests taking locks at once).
BOOST_FIXTURE_TEST_CASE(spec_C19_hundred_pipelined_acquires_of_different_keys_all_succeed,
                        RedisLockFixture) {
  constexpr int kCount = 100;
  std::vector<idemgate::core::Sha256> ids;
  std::vector<std::optional<boost::system::result<bool>>> results(kCount);
  std::vector<asio::awaitable<void>> bodies;
  for (int i = 0; i < kCount; ++i) {
    ids.push_back(random_id());
    bodies.push_back([](RedisLock* l, idemgate::core::Sha256 id, std::string token,
                        std::optional<boost::system::result<bool>>* out) -> asio::awaitable<void> {
      *out = co_await l->try_acquire(id, std::move(token), 30s);
    }(&redis_lock, ids.back(), "owner-" + std::to_string(i), &results[i]));
  }
  idemgate::test::run_all(io, std::move(bodies));
  for (const auto& r : results) {
    BOOST_REQUIRE(r.has_value());
    BOOST_CHECK(value_of(*r));
  }
  BOOST_CHECK_EQUAL(connection.connect_count(), 1u);

  // Each key holds its own owner's token: no reply went to the wrong command.
  run([](RedisLockFixture* f, std::vector<idemgate::core::Sha256> all) -> asio::awaitable<void> {
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto stored =
          co_await reply_of(f->connection.command("GET", RedisLock::key_of(all[i])));
      BOOST_CHECK_EQUAL(stored.str, "owner-" + std::to_string(i));
    }
  }(this, ids));
}

BOOST_AUTO_TEST_SUITE_END()
