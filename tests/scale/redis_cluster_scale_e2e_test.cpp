// The gateway over a real 3-primary Redis Cluster (SPEC C42): the real `idemgate` and
// `payment-service` processes, a private Postgres (scripts/local-stores, started by a global
// fixture) and a cluster that this binary starts and reshards. Each scenario prints one line
// `figures scenario=<name> …` with the answers by kind, the executions at the upstream, the keys
// involved, and the time it took.
#define BOOST_TEST_MODULE redis_cluster_scale_e2e
#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gateway/core/replay_marker.hpp"
#include "storage/redis/redis_cluster.hpp"
#include "tests/e2e/gateway_fixture.hpp"
#include "tests/fault/local_stores.hpp"
#include "tests/scale/redis_cluster.hpp"

namespace {

using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using idemgate::storage::redis::key_slot;
using idemgate::storage::redis::Reply;
using idemgate::test::fault::LocalStores;
using idemgate::test::scale::RedisCluster;
using Clock = std::chrono::steady_clock;

/// Postgres for the whole binary; its Redis is not used (the gateways here talk to the cluster).
struct PrivateStores {
  PrivateStores() { instance = std::make_unique<LocalStores>(); }
  ~PrivateStores() { instance.reset(); }
  static inline std::unique_ptr<LocalStores> instance;
};

/// Client-side bound on every request, so that a hanging gateway fails the test instead of
/// blocking it; far above the stores' operation timeouts (C25: no request hangs on a store).
constexpr auto kClientTimeout = 15s;

const std::string kGatewayProblems = "https://idemgate.dev/problems/";

std::int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

bool replayed(const HttpResponse& r) {
  return r.header("Idempotent-Replayed").value_or("") == "true";
}

bool in_flight(const HttpResponse& r) {
  return is_problem(r, 409) && problem_type(r) == kGatewayProblems + "request-in-flight" &&
         r.header("Retry-After").has_value();
}

bool store_unavailable(const HttpResponse& r) {
  return is_problem(r, 503) && problem_type(r) == kGatewayProblems + "store-unavailable" &&
         r.header("Retry-After").has_value();
}

/// How the gateway answered one request.
enum class Kind { executed, replayed, in_flight, store_unavailable, other };

Kind kind_of(const HttpResponse& r) {
  if (r.status == 201u) return replayed(r) ? Kind::replayed : Kind::executed;
  if (in_flight(r)) return Kind::in_flight;
  if (store_unavailable(r)) return Kind::store_unavailable;
  return Kind::other;
}

/// One request and what came back: a response, or the client's error (timeout, reset).
struct Answer {
  std::string key;
  HttpResponse response;
  std::string error;
};

/// Answers counted by kind, and the figures line of a scenario.
struct Tally {
  std::size_t executed = 0;
  std::size_t replayed = 0;
  std::size_t in_flight = 0;
  std::size_t store_unavailable = 0;
  std::vector<std::string> unexpected;  ///< described, for the failure message

  void add(const Answer& a) {
    if (!a.error.empty()) {
      unexpected.push_back("key " + a.key + ": no answer: " + a.error);
      return;
    }
    switch (kind_of(a.response)) {
      case Kind::executed:
        ++executed;
        break;
      case Kind::replayed:
        ++replayed;
        break;
      case Kind::in_flight:
        ++in_flight;
        break;
      case Kind::store_unavailable:
        ++store_unavailable;
        break;
      case Kind::other:
        unexpected.push_back("key " + a.key + ": " + describe(a.response));
        break;
    }
  }

  std::string text() const {
    std::ostringstream out;
    out << "executed=" << executed << " replayed=" << replayed << " in_flight=" << in_flight
        << " store_unavailable=" << store_unavailable << " unexpected=" << unexpected.size();
    return out.str();
  }
};

/// The route every scenario uses: keyed POST /payments to the payment service.
const std::string kRoute = "c42_payments";

GatewayConfig cluster_config(const RedisCluster& cluster, const PaymentService& service) {
  GatewayConfig config;
  config.upstreams = {{"payments", {service.address()}}};
  RouteConfig route;
  route.name = kRoute;
  route.path_prefix = "/payments";
  route.upstream = "payments";
  route.match_methods = {"POST"};
  route.mode = "required";
  route.methods = {"POST"};
  config.routes = {route};
  // flow_text() is the whole mapping `{cluster: […]}`; the fixture wants its entries.
  const std::string flow = cluster.flow_text();
  config.redis = flow.substr(1, flow.size() - 2);
  return config;
}

std::string lock_key_of(const std::string& key) {
  return lock_key(record_id_hex(kRoute, key));
}

/// `count` fresh keys whose lock keys are spread evenly over the cluster's primaries (as its
/// slot map stands now), so that every primary is sure to serve some.
std::vector<std::string> keys_spread_evenly(const RedisCluster& cluster, std::size_t count,
                                            const std::string& prefix) {
  const auto owners = cluster.owners();
  const std::size_t per_node = (count + cluster.size() - 1) / cluster.size();
  std::vector<std::size_t> taken(cluster.size());
  std::vector<std::string> keys;
  while (keys.size() < count) {
    auto key = unique_name(prefix);
    const auto node = owners.at(key_slot(lock_key_of(key)));
    if (taken[node] == per_node) continue;
    ++taken[node];
    keys.push_back(std::move(key));
  }
  return keys;
}

/// Every key matching `pattern` on `node` (SCAN straight on that node: no redirects).
std::set<std::string> scan_node(const RedisCluster& cluster, std::size_t node,
                                const std::string& pattern) {
  std::set<std::string> keys;
  std::string cursor = "0";
  do {
    const Reply r = cluster.command(node, {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (r.kind != Reply::Kind::array || r.elements.size() != 2)
      throw std::runtime_error("unexpected SCAN reply from node " + std::to_string(node));
    cursor = r.elements[0].str;
    for (const auto& k : r.elements[1].elements) keys.insert(k.str);
  } while (cursor != "0");
  return keys;
}

/// Calls of `command` (as INFO commandstats names it, e.g. "asking", "cluster|slots") served by
/// all nodes so far: how often the gateways followed an ASK or reloaded the slot map.
long long command_calls(const RedisCluster& cluster, const std::string& command) {
  const std::string field = "cmdstat_" + command + ":calls=";
  long long calls = 0;
  for (std::size_t n = 0; n < cluster.size(); ++n) {
    const auto info = cluster.command(n, {"INFO", "commandstats"}).str;
    const auto at = info.find(field);
    if (at != std::string::npos) calls += std::stoll(info.substr(at + field.size()));
  }
  return calls;
}

Answer send(const Gateway& gateway, const std::string& key, int instance) {
  Answer a{key, {}, {}};
  try {
    a.response = http_request(kLoopback, gateway.port(instance),
                              keyed_post("/payments", key, payment_body(key)), kClientTimeout);
  } catch (const std::exception& e) {
    a.error = e.what();
  }
  return a;
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(PrivateStores);

BOOST_AUTO_TEST_CASE(spec_C42_c19_storm_over_a_three_primary_cluster_executes_each_key_once) {
  RedisCluster cluster(3);
  // The upstream takes a while, so that each key's requests meet its lock in flight.
  PaymentService service({.delay_ms = 300});
  // Store timeouts are not this test's subject (fault_e2e has them): every duplicate that meets
  // a lock in flight looks the record up in Postgres first, so the storm's first burst queues
  // about a hundred lookups on pools that are still opening their connections, which on a small
  // shared machine outlasted the default 2 s and turned a few answers into 503.
  auto config = cluster_config(cluster, service);
  config.postgres_operation_timeout = "10s";
  config.redis_operation_timeout = "2s";
  Gateway gateway(config, 2);

  constexpr std::size_t kKeys = 20;
  constexpr std::size_t kPerKey = 50;
  constexpr std::size_t kClients = 100;  // kClients / kKeys clients per key, all at once
  constexpr std::size_t kPerClient = kKeys * kPerKey / kClients;
  const auto keys = keys_spread_evenly(cluster, kKeys, "c42-storm");
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");

  // Client c sends its kPerClient requests for key c % kKeys one after the other, each on a
  // fresh connection, alternating between the two gateways.
  const auto started = Clock::now();
  std::vector<std::vector<Answer>> by_client(kClients);
  run_concurrently(kClients, [&](std::size_t c) {
    for (std::size_t j = 0; j < kPerClient; ++j)
      by_client[c].push_back(send(gateway, keys[c % kKeys], static_cast<int>((c / kKeys + j) % 2)));
    return HttpResponse{};
  });
  const auto wall = Clock::now() - started;

  Tally total;
  std::map<std::string, std::vector<const Answer*>> by_key;
  for (const auto& answers : by_client) {
    for (const auto& a : answers) {
      total.add(a);
      by_key[a.key].push_back(&a);
    }
  }
  for (const auto& u : total.unexpected) BOOST_TEST(false, "unexpected answer: " << u);
  BOOST_TEST(total.executed + total.replayed + total.in_flight == kKeys * kPerKey);
  for (const auto& key : keys) {
    BOOST_TEST_CONTEXT("key " << key) {
      const auto& answers = by_key[key];
      BOOST_TEST(answers.size() == kPerKey);
      std::vector<const HttpResponse*> executed;
      for (const auto* a : answers)
        if (a->error.empty() && kind_of(a->response) == Kind::executed)
          executed.push_back(&a->response);
      BOOST_TEST_REQUIRE(executed.size() == 1u, gateway.diagnostics());
      for (const auto* a : answers) {
        if (a->error.empty() && kind_of(a->response) == Kind::replayed)
          BOOST_TEST(a->response.body == executed.front()->body);
      }
    }
  }
  const auto executions = service.counter("payment_posts") - posts;
  BOOST_TEST(executions == kKeys);
  BOOST_TEST(service.counter("payments_inserted") - inserted == kKeys);

  // The committed markers stay after the answers (C23): each lock key lives on the primary that
  // owns its slot, and every primary holds some. The marker is written just after the answer,
  // so wait for the last ones; the cluster offers no event to wait on.
  const auto owners = cluster.owners();
  std::vector<std::size_t> per_node(cluster.size());
  std::vector<std::size_t> scanned(cluster.size());
  const auto deadline = Clock::now() + kEventDeadline;
  for (;;) {
    std::fill(per_node.begin(), per_node.end(), 0);
    std::size_t markers = 0;
    std::vector<std::set<std::string>> on_node;
    for (std::size_t n = 0; n < cluster.size(); ++n)
      on_node.push_back(scan_node(cluster, n, "idemgate:lock:*"));
    for (const auto& key : keys) {
      const auto lock = lock_key_of(key);
      const auto node = owners.at(key_slot(lock));
      if (!on_node[node].contains(lock)) continue;
      ++per_node[node];
      const Reply value = cluster.command(node, {"GET", lock});
      if (value.kind == Reply::Kind::string && idemgate::core::is_replay_marker(value.str))
        ++markers;
    }
    for (std::size_t n = 0; n < cluster.size(); ++n) scanned[n] = on_node[n].size();
    if (markers == kKeys) break;
    if (Clock::now() > deadline) {
      BOOST_TEST(markers == kKeys, "committed markers found: " << markers);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  std::ostringstream nodes;
  for (std::size_t n = 0; n < cluster.size(); ++n) {
    BOOST_TEST(per_node[n] >= 1u, "node " << n << " holds none of the storm's lock keys");
    nodes << (n == 0 ? "" : "/") << per_node[n];
  }
  BOOST_TEST(scanned[0] + scanned[1] + scanned[2] == kKeys);
  std::cout << "figures scenario=c42_c19_storm keys=" << kKeys << " requests=" << kKeys * kPerKey
            << " " << total.text() << " executions=" << executions
            << " lock_keys_per_node=" << nodes.str() << " wall_ms=" << ms(wall) << std::endl;
}

BOOST_AUTO_TEST_CASE(spec_C42_a_reshard_under_load_fails_nothing_beyond_on_store_error) {
  RedisCluster cluster(3);
  PaymentService service;
  Gateway gateway(cluster_config(cluster, service), 2);
  const auto posts = service.counter("payment_posts");
  const auto inserted = service.counter("payments_inserted");
  const auto owners_before = cluster.owners();
  const auto slot_loads_before = command_calls(cluster, "cluster|slots");

  // Each client: a new key, then one retry of the key it sent before (so the retry comes a
  // request later, once the first answer's lock has usually turned into the marker), over and
  // over until the reshards end; then the retry of its last key.
  constexpr std::size_t kClients = 4;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> answered{0};
  std::atomic<std::size_t> during_reshard{0};
  std::atomic<bool> resharding{false};
  std::vector<std::vector<Answer>> by_client(kClients);
  std::vector<std::thread> clients;
  for (std::size_t c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::string previous;
      const auto record = [&](Answer a) {
        by_client[c].push_back(std::move(a));
        if (resharding) ++during_reshard;
        ++answered;
        answered.notify_all();
      };
      const int instance = static_cast<int>(c % 2);
      while (!stop) {
        auto key = unique_name("c42-reshard");
        record(send(gateway, key, instance));
        if (!previous.empty()) record(send(gateway, previous, 1 - instance));
        previous = std::move(key);
      }
      record(send(gateway, previous, 1 - instance));
    });
  }

  // Let the load run before the slots move, then move them twice under it.
  for (auto n = answered.load(); n < 50; n = answered.load()) answered.wait(n);
  const auto reshard_start = Clock::now();
  resharding = true;
  std::string failure;
  try {
    cluster.reshard(0, 1, 1500);
    cluster.reshard(2, 0, 1500);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  resharding = false;
  const auto reshard_time = Clock::now() - reshard_start;
  stop = true;
  for (auto& t : clients) t.join();
  BOOST_REQUIRE_MESSAGE(failure.empty(), failure);

  // The gateway follows the moved slots: new keys whose lock slot changed owner execute.
  const auto owners_after = cluster.owners();
  std::size_t moved = 0;
  for (std::size_t slot = 0; slot < owners_after.size(); ++slot)
    moved += owners_before[slot] != owners_after[slot] ? 1 : 0;
  std::vector<Answer> after;
  for (int instance = 0; instance < 2; ++instance) {
    for (std::size_t found = 0; found < 5;) {
      auto key = unique_name("c42-moved");
      const auto slot = key_slot(lock_key_of(key));
      if (owners_before[slot] == owners_after[slot]) continue;
      after.push_back(send(gateway, key, instance));
      ++found;
    }
  }
  for (const auto& a : after) {
    BOOST_TEST((a.error.empty() && kind_of(a.response) == Kind::executed),
               "a new key in a moved slot did not execute: "
                   << (a.error.empty() ? describe(a.response) : a.error) << "\n"
                   << gateway.diagnostics());
  }

  Tally total;
  std::map<std::string, std::vector<const Answer*>> by_key;
  for (const auto& answers : by_client) {
    for (const auto& a : answers) {
      total.add(a);
      by_key[a.key].push_back(&a);
    }
  }
  for (const auto& a : after) {
    total.add(a);
    by_key[a.key].push_back(&a);
  }
  for (const auto& u : total.unexpected) BOOST_TEST(false, "unexpected answer: " << u);
  if (!total.unexpected.empty()) BOOST_TEST_MESSAGE(gateway.diagnostics());

  // Exactly once: each key executed at most once, the upstream ran once per executed key, and
  // every replay carries the executed answer's bytes.
  std::size_t executed_keys = 0;
  std::size_t replays_checked = 0;
  for (const auto& [key, answers] : by_key) {
    const HttpResponse* executed = nullptr;
    std::size_t executions_of_key = 0;
    for (const auto* a : answers) {
      if (a->error.empty() && kind_of(a->response) == Kind::executed) {
        executed = &a->response;
        ++executions_of_key;
      }
    }
    BOOST_TEST(executions_of_key <= 1u, "key " << key << " executed " << executions_of_key);
    executed_keys += executions_of_key == 0 ? 0 : 1;
    for (const auto* a : answers) {
      if (!a->error.empty() || kind_of(a->response) != Kind::replayed) continue;
      BOOST_TEST(executed != nullptr, "key " << key << " replayed without having executed");
      if (executed) BOOST_TEST(a->response.body == executed->body, "key " << key);
      ++replays_checked;
    }
  }
  const auto executions = service.counter("payment_posts") - posts;
  BOOST_TEST(executions == executed_keys);
  BOOST_TEST(service.counter("payments_inserted") - inserted == executed_keys);
  BOOST_TEST(during_reshard.load() > 0u, "no answer arrived while the slots moved");

  std::cout << "figures scenario=c42_reshard_under_load slots_moved=" << moved
            << " reshard_ms=" << ms(reshard_time) << " answers="
            << total.executed + total.replayed + total.in_flight + total.store_unavailable +
                   total.unexpected.size()
            << " answers_during_reshard=" << during_reshard.load() << " " << total.text()
            << " distinct_keys=" << by_key.size() << " executed_keys=" << executed_keys
            << " executions=" << executions << " replays_checked=" << replays_checked
            << " asking=" << command_calls(cluster, "asking")
            << " slot_map_loads=" << command_calls(cluster, "cluster|slots") - slot_loads_before
            << std::endl;
}

// The `keys` CLI runs the gateway's own cluster client: it finds the lock key on the node that
// owns its slot (not the first seed), shows the record with its committed marker, and purge
// deletes both, after which the key executes again.
BOOST_AUTO_TEST_CASE(keys_show_and_purge_reach_the_node_that_owns_the_key) {
  RedisCluster cluster(3);
  PaymentService payments;
  Gateway gateway(cluster_config(cluster, payments));
  std::string key;
  do {
    key = unique_name("c42-cli");
  } while (cluster.owner(key_slot(lock_key_of(key))) == 0);
  const std::string lock = lock_key_of(key);
  const auto owner = cluster.owner(key_slot(lock));

  const Answer first = send(gateway, key, 0);
  BOOST_TEST_REQUIRE(first.error.empty(), first.error);
  BOOST_TEST_REQUIRE((kind_of(first.response) == Kind::executed), describe(first.response));
  BOOST_TEST_REQUIRE(eventually([&] {
    const Reply held = cluster.command(owner, {"GET", lock});
    return held.kind == Reply::Kind::string && idemgate::core::is_replay_marker(held.str);
  }));

  const auto shown =
      run_keys(gateway.config_path(), gateway.dir(), {"show", "--route", kRoute, key});
  BOOST_TEST(shown.status == 0, shown.err);
  BOOST_TEST(shown.out.find("status 201\n") != std::string::npos, shown.out);
  BOOST_TEST(shown.out.find("replay_marker present\n") != std::string::npos, shown.out);

  const auto purged =
      run_keys(gateway.config_path(), gateway.dir(), {"purge", "--route", kRoute, key});
  BOOST_TEST(purged.status == 0, purged.err);
  BOOST_TEST(purged.out.find("deleted record ") != std::string::npos, purged.out);
  BOOST_TEST(purged.out.find("deleted replay marker " + lock) != std::string::npos, purged.out);
  BOOST_TEST(!cluster.holds(owner, lock));
  const auto gone =
      run_keys(gateway.config_path(), gateway.dir(), {"show", "--route", kRoute, key});
  BOOST_TEST(gone.status == 1);
  BOOST_TEST(gone.out == "not found\n");

  // Executed again: the payment service's own UNIQUE answers it with the existing payment (200).
  const Answer again = send(gateway, key, 0);
  BOOST_TEST(((again.response.status == 200u || again.response.status == 201u) &&
              !replayed(again.response)),
             again.error << describe(again.response));
}
