#define BOOST_TEST_MODULE redis_cluster_scale_test
#include <openssl/evp.h>
#include <signal.h>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_cluster.hpp"
#include "tests/scale/redis_cluster.hpp"
#include "tests/storage/redis_test_support.hpp"
#include "tests/support/spec_bounds.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using idemgate::core::PrimaryTracker;
using idemgate::core::store_errc;
using idemgate::storage::redis::key_slot;
using idemgate::storage::redis::make_redis_client;
using idemgate::storage::redis::RedisClient;
using idemgate::storage::redis::Reply;
using idemgate::test::scale::RedisCluster;

using idemgate::test::IgnoreSigpipe;
BOOST_TEST_GLOBAL_FIXTURE(IgnoreSigpipe);

namespace {

std::string random_name(const std::string& prefix) {
  static std::mt19937_64 engine{std::random_device{}()};
  return prefix + std::to_string(engine());
}

/// A hash tag whose slot is owned by `node` and lies in [first, last].
std::string tag_in(const RedisCluster& cluster, std::size_t node, std::uint16_t first = 0,
                   std::uint16_t last = 16383) {
  const auto owners = cluster.owners();
  for (int i = 0;; ++i) {
    auto tag = "t" + std::to_string(i);
    const auto slot = key_slot(tag);
    if (slot >= first && slot <= last && owners[slot] == node) return "{" + tag + "}";
  }
}

/// Calls of `CLUSTER SLOTS` served by all nodes so far.
long long cluster_slots_calls(const RedisCluster& cluster) {
  long long calls = 0;
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    const auto info = cluster.command(i, {"INFO", "commandstats"}).str;
    const auto at = info.find("cmdstat_cluster|slots:calls=");
    if (at != std::string::npos) calls += std::stoll(info.substr(at + 28));
  }
  return calls;
}

std::string sha1_hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha1(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < size; ++i) {
    char pair[3];
    std::snprintf(pair, sizeof pair, "%02x", digest[i]);
    hex += pair;
  }
  return hex;
}

/// storage.redis.operation_timeout of the client under test.
constexpr std::chrono::milliseconds kOperationTimeout{500};
/// SPEC C25: a command that meets a stopped or frozen node, or a map reload that does, ends with
/// a store error once operation_timeout has run out, never later (spec::kStoreFaultMargin on top).
constexpr auto kStoreFaultBound = kOperationTimeout + idemgate::test::spec::kStoreFaultMargin;

struct ClusterFixture {
  RedisCluster cluster;
  asio::io_context io;
  std::shared_ptr<PrimaryTracker> tracker = std::make_shared<PrimaryTracker>();
  std::unique_ptr<RedisClient> client = make_redis_client(io.get_executor(), options(), tracker);

  idemgate::config::Redis options() const {
    idemgate::config::Redis o;
    o.mode = idemgate::config::Redis::Mode::cluster;
    o.cluster = cluster.seeds();
    o.operation_timeout = kOperationTimeout;
    return o;
  }

  void run(asio::awaitable<void> body) { idemgate::test::run_one(io, std::move(body)); }

  /// Runs one command through the client; a store error fails the case.
  Reply exec(const std::string& key, std::vector<std::string> argv) {
    Reply out;
    run([](RedisClient* c, std::string k, std::vector<std::string> a,
           Reply* o) -> asio::awaitable<void> {
      *o = co_await idemgate::test::reply_of(c->execute(std::move(k), std::move(a)));
    }(client.get(), key, std::move(argv), &out));
    return out;
  }

  /// Runs one command through the client and returns its outcome.
  boost::system::result<Reply> try_exec(const std::string& key, std::vector<std::string> argv) {
    boost::system::result<Reply> out = Reply{};
    run([](RedisClient* c, std::string k, std::vector<std::string> a,
           boost::system::result<Reply>* o) -> asio::awaitable<void> {
      *o = co_await c->execute(std::move(k), std::move(a));
    }(client.get(), key, std::move(argv), &out));
    return out;
  }

  std::string probe() {
    std::string out;
    run([](RedisClient* c, std::string* o) -> asio::awaitable<void> { *o = co_await c->probe(); }(
                                               client.get(), &out));
    return out;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(redis_cluster, ClusterFixture)

BOOST_AUTO_TEST_CASE(spec_C42_each_key_goes_to_the_primary_owning_its_slot) {
  std::set<std::size_t> owners;
  for (int i = 0; i < 30; ++i) {
    const auto key = random_name("idem:lock:");
    BOOST_TEST(exec(key, {"SET", key, "token", "PX", "60000"}).is_status("OK"));
    const auto owner = cluster.owner(key_slot(key));
    owners.insert(owner);
    for (std::size_t node = 0; node < cluster.size(); ++node)
      BOOST_TEST(cluster.holds(node, key) == (node == owner), key << " on node " << node);
    BOOST_TEST(exec(key, {"GET", key}).str == "token");
  }
  BOOST_TEST(owners.size() == 3u, "30 lock keys spread over all 3 primaries");
  for (const std::string key : {"123456789", "foo", "{user1000}.following", "foo{}{bar}",
                                "foo{{bar}}zap", "foo{bar", "{}", ""}) {
    const auto slot = cluster.command(0, {"CLUSTER", "KEYSLOT", key});
    BOOST_TEST(key_slot(key) == slot.integer, "CLUSTER KEYSLOT " << key);
  }
  BOOST_TEST(exec("", {"PING"}).is_status("PONG"));
  BOOST_TEST(client->connect_count() == 3u);
  BOOST_TEST(probe() == "");
}

BOOST_AUTO_TEST_CASE(spec_C42_moved_after_a_reshard_is_followed_with_one_map_reload) {
  // Node 0 owns the lowest slots; the reshard moves its lowest 200 to node 1.
  const auto moved = tag_in(cluster, 0, 0, 199);
  const auto stays = tag_in(cluster, 2);
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back(moved + ":" + std::to_string(i));
  for (const auto& key : keys) BOOST_TEST(exec(key, {"SET", key, key}).is_status("OK"));
  BOOST_TEST(exec(stays, {"SET", stays, "2"}).is_status("OK"));
  BOOST_TEST(tracker->switches() == 0u);

  cluster.reshard(0, 1, 200);
  BOOST_REQUIRE_EQUAL(cluster.owner(key_slot(moved)), 1u);
  const auto reloads_before = cluster_slots_calls(cluster);

  // Twenty commands meet MOVED at once: one reload serves them all.
  std::vector<asio::awaitable<void>> bodies;
  for (const auto& key : keys) {
    bodies.push_back([](RedisClient* c, std::string k) -> asio::awaitable<void> {
      std::vector<std::string> argv{"GET", k};
      const auto got = co_await idemgate::test::reply_of(c->execute(k, std::move(argv)));
      BOOST_TEST(got.str == k);
    }(client.get(), key));
  }
  idemgate::test::run_all(io, std::move(bodies));
  BOOST_TEST(cluster_slots_calls(cluster) - reloads_before == 1);

  const auto fresh = moved + ":new";
  BOOST_TEST(exec(fresh, {"SET", fresh, "v"}).is_status("OK"));
  BOOST_TEST(cluster.holds(1, fresh));
  BOOST_TEST(exec(stays, {"GET", stays}).str == "2");
  BOOST_TEST(client->connect_count() == 3u);
  // Slot 0's range now has another primary: one switch (SPEC C46, see redis_cluster.hpp).
  BOOST_TEST(tracker->switches() == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C42_ask_during_a_slot_migration_is_followed) {
  const auto tag = tag_in(cluster, 0);
  const auto slot = key_slot(tag);
  const auto a = tag + ":a", b = tag + ":b", c = tag + ":c";
  BOOST_TEST(exec(a, {"SET", a, "1"}).is_status("OK"));
  BOOST_TEST(exec(b, {"SET", b, "2"}).is_status("OK"));

  cluster.begin_migration(slot, 0, 1);
  cluster.migrate_key(a, 0, 1);
  BOOST_REQUIRE(!cluster.holds(0, a));
  BOOST_TEST(cluster.command(0, {"GET", a}).str.starts_with("ASK "));

  // Moved already: node 0 answers ASK, node 1 serves it after ASKING.
  BOOST_TEST(exec(a, {"GET", a}).str == "1");
  // Not there yet: node 0 still serves it.
  BOOST_TEST(exec(b, {"GET", b}).str == "2");
  // A new key of a migrating slot is created on the importing node.
  BOOST_TEST(exec(c, {"SET", c, "3"}).is_status("OK"));
  BOOST_TEST(!cluster.holds(0, c));
  // The map still names node 0 (ASK changes no routing): the next command asks again.
  BOOST_TEST(exec(c, {"INCR", c}).integer == 4);

  cluster.migrate_key(b, 0, 1);
  cluster.end_migration(slot, 1);
  for (const auto& key : {a, b, c}) BOOST_TEST(cluster.holds(1, key), key);
  BOOST_TEST(exec(b, {"GET", b}).str == "2");
  BOOST_TEST(exec(c, {"GET", c}).str == "4");
}

BOOST_AUTO_TEST_CASE(spec_C42_a_stopped_node_is_unavailable_not_a_hang) {
  const auto on_0 = tag_in(cluster, 0) + ":k", on_2 = tag_in(cluster, 2) + ":k";
  BOOST_TEST(exec(on_2, {"SET", on_2, "x"}).is_status("OK"));
  BOOST_TEST(probe() == "");

  cluster.stop(2);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second one reloads the map first
    const auto start = std::chrono::steady_clock::now();
    const auto r = try_exec(on_2, {"GET", on_2});
    BOOST_TEST((std::chrono::steady_clock::now() - start <= kStoreFaultBound));  // SPEC C25
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error() == store_errc::unavailable), r.error().message());
  }
  BOOST_TEST(exec(on_0, {"SET", on_0, "y"}).is_status("OK"));
  const auto reason = probe();
  BOOST_TEST(reason.find(std::to_string(cluster.port(2))) != std::string::npos, reason);
}

BOOST_AUTO_TEST_CASE(spec_C42_a_frozen_node_times_out_within_the_operation_timeout) {
  const auto on_1 = tag_in(cluster, 1) + ":k", on_0 = tag_in(cluster, 0) + ":k";
  BOOST_TEST(exec(on_1, {"SET", on_1, "x"}).is_status("OK"));
  cluster.signal(1, SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  const auto r = try_exec(on_1, {"GET", on_1});
  BOOST_TEST((std::chrono::steady_clock::now() - start <= kStoreFaultBound));  // SPEC C25
  cluster.signal(1, SIGCONT);
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST((r.error() == store_errc::timed_out), r.error().message());
  BOOST_TEST(exec(on_0, {"GET", on_0}).is_nil());
  BOOST_TEST(exec(on_1, {"GET", on_1}).str == "x");
}

BOOST_AUTO_TEST_CASE(spec_C42_a_caller_cancelled_during_the_map_reload_leaves_none_waiting) {
  using namespace asio::experimental::awaitable_operators;
  const auto key = tag_in(cluster, 1) + ":k";
  cluster.signal(0, SIGSTOP);  // the first seed: the reload waits on it
  std::vector<asio::awaitable<void>> bodies;
  bodies.push_back([](RedisClient* c, std::string k) -> asio::awaitable<void> {
    std::vector<std::string> argv{"GET", k};
    asio::steady_timer timer(co_await asio::this_coro::executor, 100ms);
    const auto first =
        co_await (c->execute(k, std::move(argv)) || timer.async_wait(idemgate::test::use_nothrow));
    BOOST_TEST(first.index() == 1u, "the timer wins: the caller is cancelled mid-reload");
  }(client.get(), key));
  bodies.push_back([](RedisClient* c, std::string k) -> asio::awaitable<void> {
    co_await idemgate::test::sleep_for(co_await asio::this_coro::executor, 20ms);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> argv{"GET", k};
    const auto r = co_await c->execute(k, std::move(argv));
    // SPEC C25: at worst the waiter reloads the map itself and meets the frozen seed once.
    BOOST_TEST((std::chrono::steady_clock::now() - start <= kStoreFaultBound),  // SPEC C25
               "the waiter is not stuck");
    if (r) BOOST_TEST(r->is_nil());
  }(client.get(), key));
  idemgate::test::run_all(io, std::move(bodies));
  cluster.signal(0, SIGCONT);
  BOOST_TEST(exec(key, {"SET", key, "v"}).is_status("OK"));
}

BOOST_AUTO_TEST_CASE(spec_C42_lock_scripts_with_evalsha_fallback_run_on_every_node) {
  // The shape of RedisLock's release: compare the token, then delete.
  const std::string script =
      "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
      "else return 0 end";
  const auto sha = sha1_hex(script);
  for (std::size_t node = 0; node < cluster.size(); ++node) {
    const auto key = tag_in(cluster, node) + random_name(":lock:");
    BOOST_TEST(exec(key, {"SET", key, "me", "NX", "PX", "60000"}).is_status("OK"));
    // Scripts are cached per node: the first EVALSHA on each node misses.
    const auto miss = exec(key, {"EVALSHA", sha, "1", key, "other"});
    BOOST_TEST(miss.str.starts_with("NOSCRIPT"), miss.str);
    BOOST_TEST(exec(key, {"EVAL", script, "1", key, "other"}).integer == 0);
    BOOST_TEST(exec(key, {"EVALSHA", sha, "1", key, "me"}).integer == 1);
    BOOST_TEST(!cluster.holds(node, key));
  }
}

BOOST_AUTO_TEST_SUITE_END()
