#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <string>

#include "gateway/core/errors.hpp"
#include "gateway/core/hash.hpp"

namespace idemgate::core {

/// What an acquire found: the lock is now the caller's, or the key holds another value (another
/// owner's token, or a committed marker: core/replay_marker.hpp).
struct Acquired {
  bool acquired = false;
  std::string holder;  ///< !acquired: the value that holds the key
};

/// The in-flight lock (SPEC C18, C23): `SET key token NX PX ttl`, renewed by its owner, released
/// by compare-and-delete. The store key is built from the record id hash, never from client
/// input. One instance per io thread; not thread-safe. Every operation ends within the lock
/// store's operation_timeout.
///
/// Errors (as `store_errc` conditions): `unavailable`, `timed_out` (the connection is dropped
/// and re-established for later calls), `protocol`.
class LockService {
 public:
  virtual ~LockService() = default;

  /// Takes the lock for `ttl` if the key is free, and otherwise returns what holds it, in one
  /// round trip (`SET key token NX PX ttl GET`).
  virtual boost::asio::awaitable<boost::system::result<Acquired>> acquire(
      Sha256 id, std::string token, std::chrono::milliseconds ttl) = 0;

  /// acquire() reduced to "taken by `token`" (true) or "held by another value" (false).
  boost::asio::awaitable<boost::system::result<bool>> try_acquire(Sha256 id, std::string token,
                                                                  std::chrono::milliseconds ttl);

  /// Extends the lock to `ttl` from now if `token` still owns it. false: the lock was lost
  /// (expired or taken by another owner).
  virtual boost::asio::awaitable<boost::system::result<bool>> renew(
      Sha256 id, std::string token, std::chrono::milliseconds ttl) = 0;

  /// Deletes the lock only if `token` owns it (atomic compare-and-delete). false: not the owner
  /// (nothing was deleted). Idempotent. `token` may be any value the key holds: a stale marker
  /// is dropped the same way.
  virtual boost::asio::awaitable<boost::system::result<bool>> release(Sha256 id,
                                                                      std::string token) = 0;

  /// Replaces the key's value by `value` with `ttl` only if `token` owns it (atomic
  /// compare-and-replace): the lock becomes the committed marker (C23). false: not the owner
  /// (nothing was written). Idempotent.
  virtual boost::asio::awaitable<boost::system::result<bool>> replace(
      Sha256 id, std::string token, std::string value, std::chrono::milliseconds ttl) = 0;
};

}  // namespace idemgate::core
