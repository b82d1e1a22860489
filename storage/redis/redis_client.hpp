#pragma once
// Where a Redis command goes. `storage.redis` has three shapes (SPEC C41, C42): one server, the
// primary that sentinels name, or the Redis Cluster node that owns the key's hash slot. The lock
// talks to a RedisClient and never learns which one it has.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <memory>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/core/primary_tracker.hpp"
#include "storage/redis/redis_connection.hpp"

namespace idemgate::storage::redis {

/// Runs commands on the right Redis server for one io thread (SPEC C25, C41, C42).
///
/// Errors are those of RedisConnection::execute: `store_errc::unavailable` (no primary reachable,
/// connection lost, `TRYAGAIN`/`CLUSTERDOWN`/`READONLY`: the command may or may not have run),
/// `timed_out`, `protocol`; a Redis error reply the client does not handle itself is returned as
/// a Reply of kind `error`.
///
/// Thread safety: none; one per io thread, used from that thread only, destroyed before its
/// io_context.
class RedisClient {
 public:
  virtual ~RedisClient() = default;

  /// Sends `argv`, a command that touches the single key `key` (a cluster routes on it; "" for
  /// a command with no key, which goes to any primary), and waits for its reply. `undo` (may
  /// be empty) runs on that server if the reply is lost (RedisConnection).
  virtual boost::asio::awaitable<boost::system::result<Reply>> execute(
      std::string key, std::vector<std::string> argv, Undo undo) = 0;

  /// execute() without an undo. (Not a default argument: GCC 12 destroys a coroutine's default
  /// argument twice.)
  boost::asio::awaitable<boost::system::result<Reply>> execute(std::string key,
                                                               std::vector<std::string> argv) {
    return execute(std::move(key), std::move(argv), Undo{});
  }

  /// Like execute, and sends `then` right behind `argv` on the same connection (behind the
  /// redirected command after a redirect), returning both replies: `WAIT` after a lock's `SET`
  /// (SPEC C41). `then` has no key of its own.
  virtual boost::asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_then(
      std::string key, std::vector<std::string> argv, std::vector<std::string> then, Undo undo) = 0;

  /// Checks that every primary this client needs answers `PING` (the readiness probe, SPEC
  /// C30): empty when they do, otherwise what failed, for `/readyz`.
  virtual boost::asio::awaitable<std::string> probe() = 0;

  /// Connections opened so far to data servers (primaries), for tests and metrics.
  virtual std::uint64_t connect_count() const = 0;
};

/// The single-server client (`storage.redis.address`/`port`): every command on one
/// RedisConnection, owned or borrowed (which must then outlive the client).
class SingleServerClient final : public RedisClient {
 public:
  explicit SingleServerClient(RedisConnection& connection) : connection_(&connection) {}
  explicit SingleServerClient(std::unique_ptr<RedisConnection> connection)
      : owned_(std::move(connection)), connection_(owned_.get()) {}

  boost::asio::awaitable<boost::system::result<Reply>> execute(std::string key,
                                                               std::vector<std::string> argv,
                                                               Undo undo) override;
  using RedisClient::execute;
  boost::asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_then(
      std::string key, std::vector<std::string> argv, std::vector<std::string> then,
      Undo undo) override;
  boost::asio::awaitable<std::string> probe() override;
  std::uint64_t connect_count() const override { return connection_->connect_count(); }

 private:
  std::unique_ptr<RedisConnection> owned_;
  RedisConnection* connection_;
};

/// The client for `options.mode`: a single connection, a Sentinel-following connection or a
/// cluster router. `tracker` (shared by the process's clients; may be null) sees each primary in
/// use (SPEC C46).
std::unique_ptr<RedisClient> make_redis_client(boost::asio::any_io_executor executor,
                                               const config::Redis& options,
                                               std::shared_ptr<core::PrimaryTracker> tracker);

/// Sends `first` and `second` back to back on `connection` (after `ASKING` when `asking`) and
/// returns their replies (the reply to ASKING is not returned).
boost::asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_pair(
    RedisConnection& connection, std::vector<std::string> first, std::vector<std::string> second,
    Undo undo, bool asking = false);

/// Sends `argv` on `connection` (after `ASKING` when `asking`) and returns its reply.
boost::asio::awaitable<boost::system::result<Reply>> execute_one(RedisConnection& connection,
                                                                 std::vector<std::string> argv,
                                                                 Undo undo, bool asking = false);

/// `host:port`, with brackets around an IPv6 host.
std::string endpoint_text(const std::string& host, std::uint16_t port);

/// True for a Redis error reply that means "this server is not the primary (any more)":
/// `READONLY …` (also inside a script's error), `MASTERDOWN …`.
bool is_not_primary_error(const Reply& reply);

}  // namespace idemgate::storage::redis
