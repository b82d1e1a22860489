#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <string>

#include "gateway/core/errors.hpp"
#include "gateway/core/hash.hpp"

namespace idemgate::core {

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

  /// Takes the lock for `ttl` if nobody holds it. true: acquired by `token`; false: held by
  /// another owner.
  virtual boost::asio::awaitable<boost::system::result<bool>> try_acquire(
      Sha256 id, std::string token, std::chrono::milliseconds ttl) = 0;

  /// Extends the lock to `ttl` from now if `token` still owns it. false: the lock was lost
  /// (expired or taken by another owner).
  virtual boost::asio::awaitable<boost::system::result<bool>> renew(
      Sha256 id, std::string token, std::chrono::milliseconds ttl) = 0;

  /// Deletes the lock only if `token` owns it (atomic compare-and-delete). false: not the owner
  /// (nothing was deleted). Idempotent.
  virtual boost::asio::awaitable<boost::system::result<bool>> release(Sha256 id,
                                                                      std::string token) = 0;
};

}  // namespace idemgate::core
