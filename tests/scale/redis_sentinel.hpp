#pragma once
// A Redis Sentinel deployment on loopback for scale tests (SPEC C41, C46): one primary, one
// replica and three sentinels, each a `redis-server` child process on a free 127.0.0.1 port with
// its files in a temporary directory, so that a test may kill the primary and watch the
// sentinels promote the replica.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"
#include "storage/redis/redis_connection.hpp"
#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::scale {

/// A decoded Redis reply, nested for arrays.
using RedisValue = storage::redis::Reply;

/// The reply as one line for messages: arrays in brackets, errors prefixed with `-`.
std::string describe_reply(const RedisValue& reply);

/// Sends one command to 127.0.0.1:`port` on a fresh connection (after `AUTH password` when
/// `password` is not empty) and returns its reply. Connect, write and read each give up after
/// `timeout`. Throws std::runtime_error when the server cannot be reached or the connection
/// fails; a Redis error reply is returned, not thrown.
RedisValue redis_command(std::uint16_t port, const std::vector<std::string>& argv,
                         const std::string& password = "",
                         std::chrono::milliseconds timeout = std::chrono::seconds(2));

/// The value of `field` in an `INFO` reply (`field:value` lines), or nullopt.
std::optional<std::string> info_field(const std::string& info, const std::string& field);

/// One primary, one replica (`replicaof`) and three sentinels (quorum 2, `down-after-milliseconds
/// 1000`, `failover-timeout 3000`, `resolve-hostnames no`), without persistence (`save ""`,
/// `appendonly no`). The constructor returns once the replica is in sync and every sentinel
/// names the primary and knows the replica and the two other sentinels; it throws
/// std::runtime_error with the processes' log tails when that does not happen within
/// e2e::kEventDeadline. The destructor stops every process by PID.
///
/// The data nodes keep their ports for life: after a failover the replica's port is the
/// primary's (primary_port() and replica_port() follow the roles).
///
/// @par Thread Safety
/// Use from the thread that created the object (the processes are its children, see
/// ChildProcess).
class SentinelTopology {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::string master_name = "idem";
    /// `requirepass` and `masterauth` on the data nodes (`sentinel auth-pass` on the sentinels);
    /// empty: none.
    std::string password;
    /// `requirepass` on the sentinels (`sentinel sentinel-pass` between them); empty: none.
    std::string sentinel_password;
    /// The sentinels monitor the replica's address instead of the primary's: they name a node
    /// that answers `ROLE` with `slave` (and, having no replica to promote, keep naming it).
    /// The constructor then waits only for the replica's sync and the sentinels' answer.
    bool monitor_replica = false;
  };

  SentinelTopology() : SentinelTopology(Options{}) {}
  explicit SentinelTopology(Options options);
  ~SentinelTopology();
  SentinelTopology(const SentinelTopology&) = delete;
  SentinelTopology& operator=(const SentinelTopology&) = delete;

  const std::string& master_name() const { return options_.master_name; }
  /// `127.0.0.1:PORT` of every sentinel.
  std::vector<std::string> sentinel_addresses() const;
  /// The entries of `storage.redis` that name this deployment: `sentinels: [...], master_name:
  /// NAME`, plus `password` and `sentinel_password` when set.
  std::string gateway_redis() const;

  /// The same as `storage.redis` options for the product's own client (mode sentinel).
  config::Redis redis_options() const;

  /// The data node that is the primary now (by this object's view: initially the first node,
  /// after wait_for_promotion() the promoted one).
  std::uint16_t primary_port() const;
  std::uint16_t replica_port() const;
  /// `127.0.0.1:PORT` of primary_port() / replica_port(), as the gateway logs them.
  std::string primary_address() const;
  std::string replica_address() const;

  /// Runs `argv` on a data node, authenticating with the nodes' password.
  RedisValue node_command(std::uint16_t port, const std::vector<std::string>& argv) const;
  /// Runs `argv` on sentinel `index`, authenticating with the sentinels' password.
  RedisValue sentinel_command(std::size_t index, const std::vector<std::string>& argv) const;

  /// Sends `signo` to the data node listening on `port`, e.g. SIGSTOP and SIGCONT for a replica
  /// that stops acknowledging writes for a while.
  void signal_node(std::uint16_t port, int signo);

  /// Sends `signo` to every sentinel (SIGSTOP: sentinels that accept connections but never
  /// answer; SIGCONT resumes them).
  void signal_sentinels(int signo);

  /// SIGKILLs the primary's process (no shutdown, no last replication) and returns when.
  Clock::time_point kill_primary();

  /// Waits until some sentinel's `SENTINEL get-master-addr-by-name` names the replica and the
  /// replica answers `ROLE` with `master`, polling every few milliseconds; returns the first
  /// moment both held. From then on primary_port() is the promoted node. Throws
  /// std::runtime_error when that does not happen within e2e::kEventDeadline.
  Clock::time_point wait_for_promotion();

  /// After wait_for_promotion(): waits until every sentinel names the new primary (the others
  /// learn it from the leader's hello messages, sent every 2 s) and returns when, for figures.
  /// Throws std::runtime_error after e2e::kEventDeadline.
  Clock::time_point wait_until_all_sentinels_agree();

  /// Starts the killed node again on its port as a replica of the current primary and waits
  /// until it is in sync (`master_link_status:up`). Throws std::runtime_error on failure.
  void restart_old_primary();

  /// The tails of every process's log, labelled, for failure messages.
  std::string diagnostics() const;

 private:
  struct Node;
  void start_data_node(Node& node, std::optional<std::uint16_t> replica_of);
  void start_sentinel(Node& node, std::uint16_t monitored_port);
  void wait_until_in_sync(const Node& replica);
  void wait_until_sentinels_ready(std::uint16_t monitored_port, bool full);

  Options options_;
  e2e::TempDir dir_;
  std::string redis_server_;
  std::vector<std::unique_ptr<Node>> nodes_;      ///< the two data nodes
  std::vector<std::unique_ptr<Node>> sentinels_;  ///< three sentinels
  std::size_t primary_ = 0;                       ///< index into nodes_
};

}  // namespace idemgate::test::scale
