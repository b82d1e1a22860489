#pragma once
// Where a Redis command goes, one policy per shape of `storage.redis` (SPEC C41, C42): one
// server, the primary that sentinels name, or the Redis Cluster node that owns the key's hash
// slot. A Routing only answers "which connection" and learns from what went wrong; the one
// retry/redirect loop over it is RedisClient::execute (redis_client.cpp).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/config/config.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_connection.hpp"

namespace idemgate::storage::redis {

/// A server as `host` and `port`.
struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
};

/// `host:port` (the host may itself contain colons: IPv6, also in brackets) into its parts.
std::optional<Endpoint> parse_endpoint(std::string_view text);

/// A `-MOVED slot host:port` or `-ASK slot host:port` reply.
struct Redirect {
  bool ask = false;
  Endpoint to;
};

/// The redirect `reply` is, if any. A node that does not know its peer's address names it as
/// `:port`: the host is then `from`'s.
std::optional<Redirect> parse_redirect(const Reply& reply, const std::string& from_host);

/// The routing policy of a RedisClient. Not thread-safe: one per client, on its io thread.
class Routing {
 public:
  virtual ~Routing() = default;

  /// The connection serving `key` now ("" for a command without a key: any primary), after
  /// asking the sentinels or loading the slot map when needed. `key` is the caller's and must
  /// outlive the call (it is awaited at once). Errors: `unavailable` (no primary known or
  /// reachable, a slot nobody serves).
  virtual boost::asio::awaitable<boost::system::result<std::shared_ptr<RedisConnection>>> route(
      std::string_view key) = 0;

  /// The connection to the node a `MOVED` or `ASK` named; null for a topology without
  /// redirects (the command then fails as `unavailable`).
  virtual std::shared_ptr<RedisConnection> redirected(const Endpoint& to) {
    (void)to;
    return nullptr;
  }
  /// Whether redirected() can name a connection (a cluster's `MOVED` and `ASK`).
  virtual bool redirects() const { return false; }

  /// Counts the routing tables installed (a cluster's slot maps); a MOVED reloads only when no
  /// reload happened since the command was routed.
  virtual std::uint64_t generation() const { return 0; }

  /// After a `MOVED`: reloads the slot map unless it was reloaded since `seen`.
  virtual boost::asio::awaitable<void> moved(std::uint64_t seen);

  /// `connection` failed (a store error, a not-primary or cluster-down answer): what routed
  /// there is looked up again before the next command.
  virtual void failed(const RedisConnection& connection) = 0;

  /// Whether a command the server refused as not-primary (`READONLY`, `MASTERDOWN`) may go once
  /// more to a primary looked up again: it did not run, and a failover moved the primary.
  virtual bool follows_failover() const = 0;

  /// The readiness probe (SPEC C30) through `client`: empty when every primary this routing
  /// needs answers `PING`, otherwise what failed.
  virtual boost::asio::awaitable<std::string> probe(RedisClient& client) = 0;

  /// `command` on every primary this routing writes locks to (RedisClient::on_each_primary,
  /// SPEC C58), through `client` where one primary serves every key.
  virtual boost::asio::awaitable<std::vector<RedisClient::NodeReply>> on_each_primary(
      RedisClient& client, Command command) = 0;

  /// Connections opened so far to data servers, for tests and metrics.
  virtual std::uint64_t connect_count() const = 0;
};

/// Every command on `connection` (`storage.redis.address`/`port`).
std::unique_ptr<Routing> single_server_routing(std::shared_ptr<RedisConnection> connection);

/// The primary named by Redis Sentinel (SPEC C41); `tracker` (may be null) sees each primary in
/// use (SPEC C46). See redis_sentinel.cpp.
std::unique_ptr<Routing> sentinel_routing(boost::asio::any_io_executor executor,
                                          const config::Redis& options,
                                          std::shared_ptr<core::PrimaryTracker> tracker);

/// The primary owning each key's hash slot in a Redis Cluster (SPEC C42); see redis_cluster.hpp.
std::unique_ptr<Routing> cluster_routing(boost::asio::any_io_executor executor,
                                         const config::Redis& options,
                                         std::shared_ptr<core::PrimaryTracker> tracker);

}  // namespace idemgate::storage::redis
