#define BOOST_TEST_MODULE redis_connection_redis_test
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_connection.hpp"
#include "storage/redis/redis_lock.hpp"
#include "tests/storage/redis_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using idemgate::core::store_errc;
using idemgate::storage::redis::RedisConnection;
using idemgate::storage::redis::Reply;
using idemgate::test::reply_of;

using idemgate::test::IgnoreSigpipe;
BOOST_TEST_GLOBAL_FIXTURE(IgnoreSigpipe);

namespace {

std::string random_key() {
  static std::mt19937_64 engine{std::random_device{}()};
  return "idemgate:test:" + std::to_string(engine());
}

/// SETs `value` under `key` and GETs it back on `c`, checking both replies byte for byte.
asio::awaitable<void> check_set_and_get_back(RedisConnection* c, std::string key,
                                             std::string value) {
  const auto set = co_await reply_of(c->command("SET", key, value, "PX", "60000"));
  BOOST_CHECK(set.is_status("OK"));
  const auto got = co_await reply_of(c->command("GET", key));
  BOOST_CHECK(got.kind == Reply::Kind::string);
  BOOST_CHECK_EQUAL(got.str.size(), value.size());
  BOOST_CHECK(got.str == value);
}

struct ConnectionFixture {
  asio::io_context io;
  idemgate::config::Redis options = idemgate::test::redis_options_from_env();

  void run(asio::awaitable<void> body) { idemgate::test::run_one(io, std::move(body)); }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(redis_connection, ConnectionFixture)

BOOST_AUTO_TEST_CASE(arguments_and_string_replies_are_binary_safe) {
  RedisConnection connection{io.get_executor(), options};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    const std::string value("a\0b\r\nc\xff", 7);
    const auto key = random_key();
    co_await check_set_and_get_back(c, key, value);
  }(&connection));
}

BOOST_AUTO_TEST_CASE(every_reply_kind_is_copied) {
  RedisConnection connection{io.get_executor(), options};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    const auto key = random_key();
    const auto missing = co_await reply_of(c->command("GET", key));
    BOOST_CHECK(missing.is_nil());

    const auto pushed = co_await reply_of(c->command("RPUSH", key, "x", "", "zz"));
    BOOST_CHECK(pushed.kind == Reply::Kind::integer);
    BOOST_CHECK_EQUAL(pushed.integer, 3);

    const auto range = co_await reply_of(c->command("LRANGE", key, "0", "-1"));
    BOOST_REQUIRE(range.kind == Reply::Kind::array);
    BOOST_REQUIRE_EQUAL(range.elements.size(), 3u);
    BOOST_CHECK_EQUAL(range.elements[0].str, "x");
    BOOST_CHECK_EQUAL(range.elements[1].str, "");
    BOOST_CHECK_EQUAL(range.elements[2].str, "zz");

    // A Redis error reply is an answer, not a store error.
    const auto wrong = co_await reply_of(c->command("INCR", key));
    BOOST_CHECK(wrong.is_error());
    BOOST_CHECK(wrong.str.starts_with("WRONGTYPE"));

    const auto deleted = co_await reply_of(c->command("DEL", key));
    BOOST_CHECK_EQUAL(deleted.integer, 1);
  }(&connection));
}

BOOST_AUTO_TEST_CASE(select_puts_the_connection_on_the_configured_db) {
  auto db1 = options;
  db1.db = 1;
  RedisConnection on_db0{io.get_executor(), options};
  RedisConnection on_db1{io.get_executor(), db1};
  run([](RedisConnection* c0, RedisConnection* c1) -> asio::awaitable<void> {
    const auto key = random_key();
    const auto set = co_await reply_of(c1->command("SET", key, "on-db-1", "PX", "60000"));
    BOOST_REQUIRE(set.is_status("OK"));
    const auto from_db1 = co_await reply_of(c1->command("GET", key));
    BOOST_CHECK_EQUAL(from_db1.str, "on-db-1");
    const auto from_db0 = co_await reply_of(c0->command("GET", key));
    BOOST_CHECK(from_db0.is_nil());
  }(&on_db0, &on_db1));
}

// AUTH is the first command on a connection; a refusal fails the commands behind it as a
// protocol error instead of letting them run unauthenticated.
BOOST_AUTO_TEST_CASE(refused_auth_fails_commands_with_protocol_error) {
  auto with_password = options;
  with_password.password = "not-the-password";
  RedisConnection connection{io.get_executor(), with_password};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    const auto r = co_await c->command("PING");
    BOOST_REQUIRE(!r.has_value());
    BOOST_CHECK(r.error() == store_errc::protocol);
  }(&connection));
}

// An ACL user limited to the lock keys and the commands REFERENCE lists: every connection
// authenticates as it first, and the lock's whole life (acquire, renew, marker, release) fits
// those permissions (without `client|id` and `client|kill`, a lost reply is undone without
// killing its connection first); a key outside the prefix is refused by Redis, a wrong password by
// AUTH.
BOOST_AUTO_TEST_CASE(an_acl_user_limited_to_the_lock_keys_runs_the_lock) {
  const std::string user = "idemgate-acl-" + std::to_string(std::random_device{}());
  RedisConnection admin{io.get_executor(), options};
  run([](RedisConnection* a, std::string u) -> asio::awaitable<void> {
    const auto created = co_await reply_of(
        a->command("ACL", "SETUSER", u, "on", ">acl-secret", "resetkeys", "~idemgate:lock:*",
                   "-@all", "+set", "+get", "+eval", "+evalsha", "+pexpire", "+del", "+ping"));
    BOOST_REQUIRE_MESSAGE(created.is_status("OK"), created.str);
  }(&admin, user));

  auto as_user = options;
  as_user.username = user;
  as_user.password = "acl-secret";
  RedisConnection connection{io.get_executor(), as_user};
  idemgate::storage::redis::RedisClient client{connection};
  idemgate::storage::redis::RedisLock lock{client};
  run([](RedisConnection* c, idemgate::storage::redis::RedisLock* l) -> asio::awaitable<void> {
    idemgate::core::Sha256 id{};
    id[0] = 0xac;
    id[1] = static_cast<std::uint8_t>(std::random_device{}());
    const auto taken = co_await l->acquire(id, "owner", 30s);
    BOOST_REQUIRE_MESSAGE(taken.has_value(), taken.error().message());
    BOOST_CHECK(taken->acquired);
    const auto renewed = co_await l->renew(id, "owner", 30s);
    BOOST_CHECK(renewed.has_value() && *renewed);
    const auto replaced = co_await l->replace(id, "owner", "IGM1 marker", 30s);
    BOOST_CHECK(replaced.has_value() && *replaced);
    const auto released = co_await l->release(id, "IGM1 marker");
    BOOST_CHECK(released.has_value() && *released);
    const auto outside = co_await reply_of(c->command("SET", random_key(), "x"));
    BOOST_CHECK(outside.is_error());
    BOOST_CHECK(outside.str.starts_with("NOPERM"));
  }(&connection, &lock));

  auto wrong = as_user;
  wrong.password = "not-the-secret";
  RedisConnection refused{io.get_executor(), wrong};
  run([](RedisConnection* c, RedisConnection* a, std::string u) -> asio::awaitable<void> {
    const auto r = co_await c->command("PING");
    BOOST_CHECK(!r.has_value() && r.error() == store_errc::protocol);
    co_await reply_of(a->command("ACL", "DELUSER", u));
  }(&refused, &admin, user));
}

// redisAsyncConnect would resolve a name on the io thread; names go through Asio first.
BOOST_AUTO_TEST_CASE(a_host_name_is_resolved_before_connecting) {
  auto by_name = options;
  BOOST_REQUIRE_EQUAL(by_name.address, "127.0.0.1");
  by_name.address = "localhost";
  RedisConnection connection{io.get_executor(), by_name};
  std::vector<std::optional<boost::system::result<Reply>>> replies(3);
  std::vector<asio::awaitable<void>> bodies;
  // Commands issued while the name resolves wait for the connection, in order.
  for (auto& slot : replies) {
    bodies.push_back([](RedisConnection* c,
                        std::optional<boost::system::result<Reply>>* out) -> asio::awaitable<void> {
      *out = co_await c->command("PING");
    }(&connection, &slot));
  }
  idemgate::test::run_all(io, std::move(bodies));
  for (const auto& r : replies) {
    BOOST_REQUIRE(r.has_value());
    BOOST_REQUIRE_MESSAGE(r->has_value(), r->error().message());
    BOOST_CHECK((*r)->is_status("PONG"));
  }
  BOOST_CHECK_EQUAL(connection.connect_count(), 1u);
}

// Commands still waiting when the connection object goes away end (unavailable) instead of
// being left suspended.
BOOST_AUTO_TEST_CASE(commands_in_flight_end_when_the_connection_is_destroyed) {
  auto connection = std::make_unique<RedisConnection>(io.get_executor(), options);
  RedisConnection side{io.get_executor(), options};
  std::optional<boost::system::result<Reply>> blocked;
  std::vector<asio::awaitable<void>> bodies;
  const auto key = random_key();
  // BLPOP on an empty list waits in the server; destroying the connection must end it.
  bodies.push_back([](RedisConnection* c, std::string k,
                      std::optional<boost::system::result<Reply>>* out) -> asio::awaitable<void> {
    *out = co_await c->command("BLPOP", k, "0");
  }(connection.get(), key, &blocked));
  bodies.push_back(
      [](std::unique_ptr<RedisConnection>* c, RedisConnection* other) -> asio::awaitable<void> {
        // A round trip on another connection lets the loop send BLPOP first.
        const auto pong = co_await reply_of(other->command("PING"));
        BOOST_CHECK(pong.is_status("PONG"));
        c->reset();
      }(&connection, &side));
  idemgate::test::run_all(io, std::move(bodies));
  BOOST_REQUIRE(blocked.has_value());
  BOOST_REQUIRE(!blocked->has_value());
  BOOST_CHECK(blocked->error() == store_errc::unavailable);
}

// A caller that stops waiting (its coroutine is cancelled) gets operation_aborted; the command
// stays in flight, and its reply is dropped rather than given to the next command.
BOOST_AUTO_TEST_CASE(a_cancelled_caller_leaves_the_connection_in_reply_order) {
  RedisConnection connection{io.get_executor(), options};
  RedisConnection side{io.get_executor(), options};
  run([](RedisConnection* c, RedisConnection* other) -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    const auto key = random_key();
    const auto warm = co_await reply_of(c->command("PING"));
    BOOST_REQUIRE(warm.is_status("PONG"));

    // BLPOP on an empty list does not answer; the caller gives up when its own timer fires.
    asio::steady_timer give_up(co_await asio::this_coro::executor, 50ms);
    auto raced =
        co_await (c->command("BLPOP", key, "0") || give_up.async_wait(asio::use_awaitable));
    BOOST_REQUIRE_EQUAL(raced.index(), 1u);

    // Unblock the BLPOP; its reply must be dropped, and the next command get its own.
    const auto pushed = co_await reply_of(other->command("RPUSH", key, "value"));
    BOOST_CHECK_EQUAL(pushed.integer, 1);
    const auto echoed = co_await reply_of(c->command("ECHO", "mine"));
    BOOST_CHECK_EQUAL(echoed.str, "mine");
    BOOST_CHECK_EQUAL(c->connect_count(), 1u);
  }(&connection, &side));
}

// The cancelled command itself reports operation_aborted.
BOOST_AUTO_TEST_CASE(a_cancelled_command_reports_operation_aborted) {
  RedisConnection connection{io.get_executor(), options};
  asio::cancellation_signal cancel;
  std::optional<boost::system::result<Reply>> blocked;
  const auto key = random_key();
  asio::co_spawn(
      io,
      [](RedisConnection* c, std::string k,
         std::optional<boost::system::result<Reply>>* out) -> asio::awaitable<void> {
        *out = co_await c->command("BLPOP", k, "0");
      }(&connection, key, &blocked),
      asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
        io.stop();
      }));
  // Cancel once the command is issued (the spawned coroutine runs first).
  asio::post(io, [&] { cancel.emit(asio::cancellation_type::terminal); });
  io.run();
  BOOST_REQUIRE(blocked.has_value());
  BOOST_REQUIRE(!blocked->has_value());
  BOOST_CHECK(blocked->error() == asio::error::operation_aborted);
}

// SPEC C41: WAIT counts only its own connection's writes, so a call's commands go back to back,
// with nothing in between, and each gets its own reply.
BOOST_AUTO_TEST_CASE(commands_of_one_call_go_back_to_back_and_each_gets_its_reply) {
  RedisConnection connection{io.get_executor(), options};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    const auto key = random_key();
    std::vector<idemgate::storage::redis::Command> set_get{{"SET", key, "v", "PX", "60000"},
                                                           {"GET", key}};
    auto pair = co_await c->execute(std::move(set_get));
    BOOST_REQUIRE(pair.has_value());
    BOOST_REQUIRE_EQUAL(pair->size(), 2u);
    BOOST_CHECK((*pair)[0].is_status("OK"));
    BOOST_CHECK((*pair)[1].str == "v");
    std::vector<idemgate::storage::redis::Command> write_wait{{"SET", key, "w"},
                                                              {"WAIT", "0", "10"}};
    auto waited = co_await c->execute(std::move(write_wait));
    BOOST_REQUIRE(waited.has_value());
    BOOST_REQUIRE_EQUAL(waited->size(), 2u);
    BOOST_CHECK((*waited)[1].kind == Reply::Kind::integer);
  }(&connection));
}

// Commands issued in one loop turn leave in one write; each caller still gets its own reply.
BOOST_AUTO_TEST_CASE(commands_issued_in_one_turn_each_get_their_own_reply) {
  RedisConnection connection{io.get_executor(), options};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto a = reply_of(c->command("ECHO", "a"));
    auto b = reply_of(c->command("ECHO", "bb"));
    auto d = reply_of(c->command("ECHO", "ccc"));
    auto e = reply_of(c->command("PING"));
    const auto [ra, rb, rd, re] =
        co_await (std::move(a) && std::move(b) && std::move(d) && std::move(e));
    BOOST_CHECK(ra.str == "a");
    BOOST_CHECK(rb.str == "bb");
    BOOST_CHECK(rd.str == "ccc");
    BOOST_CHECK(re.is_status("PONG"));
  }(&connection));
}

// A command bigger than the socket's send buffer is written in parts (the rest waits for
// writability); a reply bigger than one read arrives in several and is parsed whole.
BOOST_AUTO_TEST_CASE(a_value_larger_than_one_read_or_write_goes_and_comes_back_whole) {
  RedisConnection connection{io.get_executor(), options};
  run([](RedisConnection* c) -> asio::awaitable<void> {
    std::string value(4 * 1024 * 1024, '\0');
    std::mt19937 bytes{7};
    for (auto& ch : value) ch = static_cast<char>(bytes());
    const auto key = random_key();
    co_await check_set_and_get_back(c, key, value);
    const auto after = co_await reply_of(c->command("ECHO", "next"));
    BOOST_CHECK(after.str == "next");  // the stream is still in step after the big reply
  }(&connection));
}

// A sentinel that accepts and never answers: the caller doing the lookup is cancelled midway.
// The next command must not wait on that abandoned lookup forever (it looks up again and fails
// by its own deadline).
BOOST_AUTO_TEST_CASE(a_cancelled_sentinel_lookup_leaves_no_command_waiting) {
  asio::ip::tcp::acceptor silent(io, {asio::ip::address_v4::loopback(), 0});
  std::vector<asio::ip::tcp::socket> accepted;
  std::function<void()> accept_more = [&] {
    silent.async_accept([&](boost::system::error_code ec, asio::ip::tcp::socket s) {
      if (ec) return;
      accepted.push_back(std::move(s));
      accept_more();
    });
  };
  accept_more();
  idemgate::config::Redis sentinel_options;
  sentinel_options.mode = idemgate::config::Redis::Mode::sentinel;
  sentinel_options.sentinels = {{"127.0.0.1", silent.local_endpoint().port()}};
  sentinel_options.master_name = "m";
  sentinel_options.operation_timeout = 300ms;
  auto client =
      idemgate::storage::redis::make_redis_client(io.get_executor(), sentinel_options, nullptr);
  std::optional<std::string> probed;
  std::optional<boost::system::result<Reply>> later;
  asio::cancellation_signal cancel;
  asio::co_spawn(
      io,
      [](idemgate::storage::redis::RedisClient* c, std::optional<std::string>* out)
          -> asio::awaitable<void> { *out = co_await c->probe(); }(client.get(), &probed),
      asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr) {}));
  asio::steady_timer cancel_at(io, 50ms);
  cancel_at.async_wait([&](boost::system::error_code) {
    cancel.emit(asio::cancellation_type::terminal);
    asio::co_spawn(
        io,
        [](idemgate::storage::redis::RedisClient* c,
           std::optional<boost::system::result<Reply>>* out) -> asio::awaitable<void> {
          std::vector<std::string> ping{"PING"};
          *out = co_await c->execute(std::string{}, std::move(ping));
        }(client.get(), &later),
        [&](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
          silent.close();
          io.stop();
        });
  });
  asio::steady_timer safety(io, 10s);
  safety.async_wait([&](boost::system::error_code ec) {
    if (!ec) io.stop();
  });
  io.run();
  BOOST_REQUIRE_MESSAGE(later.has_value(), "a command after the cancelled lookup never ended");
  BOOST_CHECK(!later->has_value());
}

BOOST_AUTO_TEST_SUITE_END()
