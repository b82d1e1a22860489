// The LockService contract (tests/storage/lock_service_contract.hpp) on every Redis topology the
// product's client routes to besides one server (redis_lock_redis_test runs that one): the
// primary Redis Sentinel names (SPEC C41) and a 3-primary Redis Cluster (SPEC C42), both started
// by this binary on loopback. Plus, on each, SPEC C25's lost reply: a lock command written to a
// frozen server, given up on at operation_timeout, runs when the server resumes, and the client
// removes that lock before anything it sends afterwards.
#define BOOST_TEST_MODULE redis_lock_scale_test
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_cluster.hpp"
#include "storage/redis/redis_lock.hpp"
#include "tests/scale/redis_cluster.hpp"
#include "tests/scale/redis_sentinel.hpp"
#include "tests/storage/lock_service_contract.hpp"
#include "tests/storage/redis_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using idemgate::core::store_errc;
using idemgate::storage::redis::key_slot;
using idemgate::storage::redis::make_redis_client;
using idemgate::storage::redis::RedisClient;
using idemgate::storage::redis::RedisLock;
using idemgate::storage::redis::Reply;
using idemgate::test::lock_service_contract::random_id;
using idemgate::test::lock_service_contract::require;
using idemgate::test::scale::RedisCluster;
using idemgate::test::scale::SentinelTopology;

using idemgate::test::IgnoreSigpipe;
BOOST_TEST_GLOBAL_FIXTURE(IgnoreSigpipe);

namespace {

/// storage.redis.operation_timeout of the clients under test.
constexpr std::chrono::milliseconds kOperationTimeout{300};

/// The topologies, each started on first use and shared by the cases of its suite (a Sentinel
/// deployment takes seconds to agree on its primary); stopped when the binary ends.
struct Topologies {
  ~Topologies() {
    sentinel.reset();
    cluster.reset();
  }
  static inline std::unique_ptr<SentinelTopology> sentinel;
  static inline std::unique_ptr<RedisCluster> cluster;
};
BOOST_TEST_GLOBAL_FIXTURE(Topologies);

SentinelTopology& sentinel_topology() {
  if (!Topologies::sentinel) Topologies::sentinel = std::make_unique<SentinelTopology>();
  return *Topologies::sentinel;
}

RedisCluster& cluster_topology() {
  if (!Topologies::cluster) Topologies::cluster = std::make_unique<RedisCluster>(3);
  return *Topologies::cluster;
}

/// Calls of `SET` in an `INFO commandstats` reply.
long long set_calls_in(const Reply& info) {
  const std::string field = "cmdstat_set:calls=";
  const auto at = info.str.find(field);
  return at == std::string::npos ? 0 : std::stoll(info.str.substr(at + field.size()));
}

/// What the contract and the lost-reply case need of a topology: the product's client over
/// it, and the server that holds a given key, to freeze.
struct LockFixture {
  explicit LockFixture(idemgate::config::Redis options)
      : client(make_redis_client(io.get_executor(), with_timeout(std::move(options)), nullptr)),
        redis_lock(*client) {}

  static idemgate::config::Redis with_timeout(idemgate::config::Redis o) {
    o.operation_timeout = kOperationTimeout;
    return o;
  }

  idemgate::core::LockService& lock() { return redis_lock; }
  void run(asio::awaitable<void> body) { idemgate::test::run_one(io, std::move(body)); }
  asio::awaitable<void> let_time_pass(std::chrono::milliseconds d) {
    co_await idemgate::test::sleep_for(io.get_executor(), d);
  }

  asio::io_context io;
  std::unique_ptr<RedisClient> client;
  RedisLock redis_lock;
};

struct SentinelLockFixture : LockFixture {
  SentinelLockFixture() : LockFixture(sentinel_topology().redis_options()) {}

  /// The primary holds every key.
  void freeze_owner(const std::string& key) {
    (void)key;
    frozen = sentinel_topology().primary_port();
    sentinel_topology().signal_node(frozen, SIGSTOP);
  }
  void thaw_owner() { sentinel_topology().signal_node(frozen, SIGCONT); }
  std::uint16_t frozen = 0;
  long long set_calls(const std::string& key) {
    (void)key;
    return set_calls_in(sentinel_topology().node_command(sentinel_topology().primary_port(),
                                                         {"INFO", "commandstats"}));
  }
};

struct ClusterLockFixture : LockFixture {
  ClusterLockFixture() : LockFixture(options()) {}
  static idemgate::config::Redis options() {
    idemgate::config::Redis o;
    o.mode = idemgate::config::Redis::Mode::cluster;
    o.cluster = cluster_topology().seeds();
    return o;
  }

  void freeze_owner(const std::string& key) {
    frozen = cluster_topology().owner(key_slot(key));  // asked before: it may be node 0 itself
    cluster_topology().signal(frozen, SIGSTOP);
  }
  void thaw_owner() { cluster_topology().signal(frozen, SIGCONT); }
  std::size_t frozen = 0;
  long long set_calls(const std::string& key) {
    const auto node = cluster_topology().owner(key_slot(key));
    return set_calls_in(cluster_topology().command(node, {"INFO", "commandstats"}));
  }
};

/// SPEC C25. The server holding the key is frozen (SIGSTOP) with the acquire's `SET … NX` in its
/// socket buffer; the acquire ends with timed_out; once thawed, the server runs that SET. The
/// very next acquire of the key by another owner, through the same client, must get it: the
/// client kills the old connection and deletes the lost token before sending anything else.
template <class Fixture>
void lost_acquire_is_undone_before_the_next_command(Fixture& f) {
  const auto id = random_id();
  const std::string key = RedisLock::key_of(id);
  // Warm: the routing knows the key's server, and a connection to it is open.
  f.run([](Fixture* fx, std::string k) -> asio::awaitable<void> {
    idemgate::storage::redis::Command exists{"EXISTS", k};
    auto warm = co_await fx->client->execute(k, std::move(exists));
    BOOST_REQUIRE_MESSAGE(warm.has_value(), warm.error().message());
  }(&f, key));

  const auto before = f.set_calls(key);
  f.freeze_owner(key);
  struct Thaw {
    Fixture& f;
    bool frozen = true;
    void operator()() {
      if (std::exchange(frozen, false)) f.thaw_owner();
    }
    ~Thaw() { (*this)(); }
  } thaw{f};

  f.run([](Fixture* fx, idemgate::core::Sha256 lock_id) -> asio::awaitable<void> {
    const auto lost = co_await fx->redis_lock.acquire(lock_id, "owner-lost", 30s);
    BOOST_REQUIRE(!lost.has_value());
    BOOST_CHECK(lost.error() == store_errc::timed_out);
  }(&f, id));
  thaw();

  // The scenario happened: the thawed server ran the lost SET.
  BOOST_TEST(idemgate::test::e2e::eventually([&] { return f.set_calls(key) > before; }),
             "the frozen server never ran what it had buffered");
  f.run([](Fixture* fx, idemgate::core::Sha256 lock_id) -> asio::awaitable<void> {
    co_await require(fx->redis_lock.try_acquire(lock_id, "owner-next", 30s), true,
                     "the next owner acquires at once");
    co_await require(fx->redis_lock.release(lock_id, "owner-next"), true, "and releases");
  }(&f, id));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sentinel_lock_contract)
IDEMGATE_LOCK_SERVICE_CONTRACT(SentinelLockFixture)
BOOST_FIXTURE_TEST_CASE(spec_C25_a_lost_acquire_is_undone_before_the_next_command,
                        SentinelLockFixture) {
  lost_acquire_is_undone_before_the_next_command(*this);
}
BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cluster_lock_contract)
IDEMGATE_LOCK_SERVICE_CONTRACT(ClusterLockFixture)
BOOST_FIXTURE_TEST_CASE(spec_C25_a_lost_acquire_is_undone_before_the_next_command,
                        ClusterLockFixture) {
  lost_acquire_is_undone_before_the_next_command(*this);
}
BOOST_AUTO_TEST_SUITE_END()
