#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <string>

#include "gateway/core/lock_service.hpp"
#include "storage/redis/redis_client.hpp"

namespace idemgate::storage::redis {

/// The in-flight lock on Redis (SPEC C18, C23, C25): key `idemgate:lock:<hex of id>` holding the
/// owner token.
///
/// - `acquire`: `SET key token NX PX ttl GET` (Redis ≥ 7.0), or a Lua get-or-set on an older
///   server that refuses the combination.
/// - `renew`: a Lua compare-and-`PEXPIRE` (only the owner extends).
/// - `release`: a Lua compare-and-`DEL` (only the owner deletes).
/// - `replace`: a Lua compare-and-`SET … PX` (the owner turns its lock into the committed
///   marker, SPEC C23).
///
/// The scripts are sent with `EVALSHA` and fall back to `EVAL` when the server answers
/// `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`): the script is loaded again and the
/// command retried once. Every command touches the one lock key, so a cluster routes it whole.
///
/// With `wait_replicas` N > 0 (SPEC C41), the lock's write is followed on the same connection
/// by `WAIT N t` (t is 3/4 of `wait_timeout`, so the reply arrives before the connection's own
/// deadline; WAIT only counts its own connection's writes); fewer than N acknowledgements
/// release the lock again and `acquire` returns `unavailable`.
///
/// A lost reply (SPEC C25, C41): `acquire`, `release` and `replace` carry an Undo, the
/// compare-and-delete of their token. When their reply is lost (timeout, reset, a WAIT pair cut
/// off), the command may still have run, or may still run later; the connection deletes the
/// token as soon as Redis answers again (RedisConnection), so no lock outlives the request that
/// took it and a retry after the store recovered executes instead of getting 409 until `ttl`.
/// `renew` carries none: its request still owns the lock and releases it itself.
///
/// `ttl` is in milliseconds and must be positive. Errors as in core::LockService:
/// `unavailable`, `timed_out` (the connection is re-opened by the next call), `protocol` (an
/// error or unexpected reply from Redis).
///
/// Thread safety: none; one per io thread, on that thread's RedisClient, which must outlive it.
class RedisLock final : public core::LockService {
 public:
  struct Options {
    int wait_replicas = 0;  ///< replicas that must acknowledge a new lock (WAIT); 0: none
    std::chrono::milliseconds wait_timeout{500};  ///< normally storage.redis.operation_timeout
    /// With wait_replicas: the client that takes locks (write + WAIT), a separate connection
    /// from the one that renews, releases and replaces, so that a WAIT held up by a slow
    /// replica delays only other new locks. null: the main client.
    RedisClient* acquire_client = nullptr;
  };

  explicit RedisLock(RedisClient& client) : RedisLock(client, Options{}) {}
  RedisLock(RedisClient& client, Options options);

  boost::asio::awaitable<boost::system::result<core::Acquired>> acquire(
      core::Sha256 id, std::string token, std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<boost::system::result<bool>> renew(core::Sha256 id, std::string token,
                                                            std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<boost::system::result<bool>> release(core::Sha256 id,
                                                              std::string token) override;
  boost::asio::awaitable<boost::system::result<bool>> replace(
      core::Sha256 id, std::string token, std::string value,
      std::chrono::milliseconds ttl) override;

  /// The Redis key of the lock for `id`.
  static std::string key_of(const core::Sha256& id);

 private:
  struct Script {
    std::string source;
    std::string sha1;  ///< lower-case hex, as EVALSHA expects
  };

  /// Runs `script` with one key and `args` and returns its raw reply.
  boost::asio::awaitable<boost::system::result<Reply>> eval(const Script* script, std::string key,
                                                            std::vector<std::string> args,
                                                            Undo undo);
  /// eval() whose reply must be an integer (0 or 1).
  boost::asio::awaitable<boost::system::result<bool>> run(const Script* script, std::string key,
                                                          std::vector<std::string> args, Undo undo);

  /// The compare-and-delete of `token` on `key`, for a lock command whose reply may be lost.
  static Undo undo_of(const std::string& key, const std::string& token);

  /// acquire() with wait_replicas: the write and `WAIT` back-to-back on one connection; too few
  /// acknowledgements release the lock again and fail as unavailable.
  boost::asio::awaitable<boost::system::result<core::Acquired>> acquire_and_wait(
      std::string key, std::string token, std::chrono::milliseconds ttl);

  RedisClient& client_;
  Options options_;
  Script renew_;
  Script release_;
  Script replace_;
  Script acquire_;          ///< get-or-set, for servers without `SET … NX … GET`
  bool set_nx_get_ = true;  ///< false once the server refused `SET … NX … GET`
};

}  // namespace idemgate::storage::redis
