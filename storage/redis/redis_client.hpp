#pragma once
// The one Redis client. Every command of the gateway goes through RedisClient::execute, whatever
// the shape of `storage.redis` (SPEC C41, C42): one server, the primary that sentinels name, or
// the Redis Cluster node that owns the key's hash slot. Those are routing policies
// (redis_routing.hpp) under the one retry/redirect loop written here; the lock talks to a
// RedisClient and never learns which one it has.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "storage/redis/redis_connection.hpp"

namespace idemgate::storage::redis {

class Routing;  // redis_routing.hpp

/// Runs commands on the right Redis server for one io thread (SPEC C25, C41, C42).
///
/// Retries and redirects, the same for every topology: a command refused as not-primary
/// (`READONLY`, `MASTERDOWN`) did not run; the routing looks the primary up again and the
/// command goes once more (Sentinel, Cluster), or fails as `unavailable` (one server). `MOVED`
/// reloads the slot map and goes to the named node, `ASK` goes there once after `ASKING` on the
/// same connection; after 5 redirects the command fails with `unavailable`. `TRYAGAIN` and
/// `CLUSTERDOWN` are `unavailable`. A store error (connection lost, timed out) is returned, and
/// the routing looks up again before the next command: the command may have run.
///
/// Errors: `store_errc::unavailable`, `timed_out`, `protocol` (RedisConnection); a Redis error
/// reply the client does not handle itself is returned as a Reply of kind `error`.
///
/// Thread safety: none; one per io thread, used from that thread only, destroyed before its
/// io_context.
class RedisClient {
 public:
  explicit RedisClient(std::unique_ptr<Routing> routing);
  /// One server over `connection`, which must outlive the client.
  explicit RedisClient(RedisConnection& connection);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  /// Sends `commands` back to back in one write on the connection serving `key` (every command
  /// touches `key` or no key; "" when none does: any primary), and returns their replies in
  /// order. Redirects and not-primary refusals are judged on the first command's reply and
  /// resend the whole batch: `WAIT` after a lock's `SET` (SPEC C41) always follows the write on
  /// the server that ran it. `undo` runs on that server if the replies are lost
  /// (RedisConnection).
  boost::asio::awaitable<boost::system::result<std::vector<Reply>>> execute(
      std::string key, std::vector<Command> commands, Undo undo);
  boost::asio::awaitable<boost::system::result<std::vector<Reply>>> execute(
      std::string key, std::vector<Command> commands) {
    return execute(std::move(key), std::move(commands), Undo{});
  }

  /// One command: execute() with a batch of one, returning its reply.
  boost::asio::awaitable<boost::system::result<Reply>> execute(std::string key, Command command,
                                                               Undo undo);
  boost::asio::awaitable<boost::system::result<Reply>> execute(std::string key, Command command) {
    return execute(std::move(key), std::move(command), Undo{});
  }

  /// Checks that every primary this client needs answers `PING` (the readiness probe, SPEC
  /// C30): empty when they do, otherwise what failed, for `/readyz`.
  boost::asio::awaitable<std::string> probe();

  /// Connections opened so far to data servers (primaries), for tests and metrics.
  std::uint64_t connect_count() const;

  /// One server's answer to a command sent to every primary.
  struct NodeReply {
    std::string node;  ///< `host:port` when known, else "redis"
    boost::system::result<Reply> reply;
  };
  /// Sends `command` (a command without a key) to every primary this client writes locks to:
  /// the one server, the primary the sentinels name, or every slot owner of a cluster (SPEC C58:
  /// the store checks). One entry per primary, in no particular order; a failure to find the
  /// primaries is one entry with the error.
  boost::asio::awaitable<std::vector<NodeReply>> on_each_primary(Command command);

 private:
  std::unique_ptr<Routing> routing_;
};

/// The client for `options.mode`: one server, the Sentinel-named primary or a cluster.
/// `tracker` (shared by the process's clients; may be null) sees each primary in use (SPEC C46).
std::unique_ptr<RedisClient> make_redis_client(boost::asio::any_io_executor executor,
                                               const config::Redis& options,
                                               std::shared_ptr<core::PrimaryTracker> tracker);

/// `host:port`, with brackets around an IPv6 host.
std::string endpoint_text(const std::string& host, std::uint16_t port);

/// True for a Redis error reply that means "this server is not the primary (any more)":
/// `READONLY …` (also inside a script's error), `MASTERDOWN …`.
bool is_not_primary_error(const Reply& reply);

}  // namespace idemgate::storage::redis
