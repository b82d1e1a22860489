#pragma once
// The checks of Redis settings the lock depends on (SPEC C58).

#include <boost/asio/awaitable.hpp>

#include "gateway/core/store_check.hpp"
#include "storage/redis/redis_client.hpp"

namespace idemgate::storage::redis {

/// `redis maxmemory-policy`: `CONFIG GET maxmemory-policy` on every primary the client writes
/// locks to. An `allkeys-*` policy may evict a lock, and a request could then execute twice:
/// failed, unless `allow_eviction` (then a warning). A `volatile-*` policy may evict keys with a
/// TTL, which every lock has: a warning. `noeviction`: ok. A primary that refuses CONFIG
/// (renamed, or an ACL without `config|get`) or cannot be reached: a warning that the check
/// could not run. Async, on the client's io thread; bounded by the store's operation_timeout.
boost::asio::awaitable<core::StoreCheck> check_eviction_policy(RedisClient& client,
                                                               bool allow_eviction);

}  // namespace idemgate::storage::redis
