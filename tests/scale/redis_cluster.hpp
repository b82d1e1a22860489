#pragma once
// A real Redis Cluster for tests (SPEC C42): primaries started as `redis-server` child processes
// on free loopback ports, joined with `redis-cli --cluster create`, and the operator actions the
// tests provoke — a reshard, a manual slot migration (ASK), a stopped node.
//
// The cluster is private to one object and lives in a temporary directory removed by the
// destructor; persistence is off. `redis-server` and `redis-cli` are found on PATH.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"
#include "storage/redis/redis_connection.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::scale {

/// A Redis Cluster of `primaries` primaries without replicas, ready (`cluster_state:ok` on every
/// node, every node agreeing on the slot map) when the constructor returns.
///
/// Nodes are numbered 0…size()-1 in the order `redis-cli --cluster create` got them, so node 0
/// starts with the lowest slots. `cluster-require-full-coverage` is off: the other nodes keep
/// serving their slots while one is stopped.
///
/// @par Thread Safety
/// Use from the thread that created it (the child processes die with that thread).
class RedisCluster {
 public:
  /// Starts and joins the nodes. Throws std::runtime_error (with the tool's output) on failure.
  explicit RedisCluster(std::size_t primaries = 3);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  std::size_t size() const { return nodes_.size(); }
  std::uint16_t port(std::size_t node) const { return nodes_.at(node).port; }
  /// The node's cluster id (`CLUSTER MYID`).
  const std::string& id(std::size_t node) const { return nodes_.at(node).id; }

  /// Every node as a seed for `storage.redis.cluster`.
  std::vector<config::Server> seeds() const;
  /// The flow mapping of `storage.redis` for a gateway config: `{cluster: ["127.0.0.1:P", …]}`.
  std::string flow_text() const;

  /// Sends one command straight to `node` over a fresh connection (no redirect is followed).
  /// Throws when the node cannot be reached.
  storage::redis::Reply command(std::size_t node, const std::vector<std::string>& argv) const;

  /// The node that owns `slot` according to `asked`'s slot map; throws when none does.
  std::size_t owner(std::uint16_t slot, std::size_t asked = 0) const;
  /// The owner of every slot at once (size kClusterSlots; size() for a slot no node owns).
  std::vector<std::size_t> owners(std::size_t asked = 0) const;

  /// True when `key` is stored on `node` (`EXISTS` there answers 1; a node that does not own the
  /// key's slot answers MOVED, which is false).
  bool holds(std::size_t node, const std::string& key) const;

  /// Moves `slots` slots (the lowest of `from`'s) with their keys from node `from` to node `to`
  /// (`redis-cli --cluster reshard`), then waits until every node agrees on the new map.
  void reshard(std::size_t from, std::size_t to, int slots);

  /// Starts moving `slot` by hand: `to` IMPORTING, `from` MIGRATING. While it lasts, `from`
  /// answers `-ASK` for the slot's keys it no longer has.
  void begin_migration(std::uint16_t slot, std::size_t from, std::size_t to);
  /// Moves one key of a migrating slot (`MIGRATE` on `from`).
  void migrate_key(const std::string& key, std::size_t from, std::size_t to);
  /// Ends a migration: every node learns that `to` owns `slot`.
  void end_migration(std::uint16_t slot, std::size_t to);

  /// Stops node `node` (SIGTERM, SIGKILL after a short grace).
  void stop(std::size_t node);
  /// Sends `signal` to node `node` (SIGSTOP freezes it, SIGCONT resumes it).
  void signal(std::size_t node, int signal);

 private:
  struct Node {
    std::uint16_t port = 0;
    std::uint16_t bus_port = 0;
    std::string id;
    std::string log_path;
    std::optional<ChildProcess> process;
  };

  /// Starts one cluster-enabled redis-server on free ports and waits until it answers as
  /// itself; throws after three attempts.
  Node start_node(const std::string& server) const;
  void run_cli(const std::vector<std::string>& args, const std::string& what) const;
  void wait_until_agreed() const;

  std::filesystem::path dir_;
  std::vector<Node> nodes_;
};

}  // namespace idemgate::test::scale
