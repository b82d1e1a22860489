#pragma once
// The checks of Postgres settings the record store depends on (SPEC C58).

#include <boost/asio/awaitable.hpp>

#include "gateway/core/store_check.hpp"
#include "storage/pg/pg_pool.hpp"

namespace idemgate::storage::pg {

/// `postgres synchronous_commit`, as the gateway's own sessions see it (role and database
/// settings included): `off` → a warning (a crash of the server loses the last commits, answered
/// records among them); `local` while the server has standbys (`synchronous_standby_names` set,
/// or rows in pg_stat_replication) → a warning (a failover loses them); otherwise ok. A query
/// that fails → a warning that the check could not run. Async on the pool's io thread.
boost::asio::awaitable<core::StoreCheck> check_synchronous_commit(PgPool& pool);

/// `postgres schema version`: the highest version in `schema_migrations` against the highest
/// migration this binary carries. Older (or no table) → failed, "run idemgate migrate"; newer
/// → failed, the table belongs to a newer idemgate; equal → ok. A query that fails → a
/// warning that the check could not run. Async on the pool's io thread.
boost::asio::awaitable<core::StoreCheck> check_schema_version(PgPool& pool);

}  // namespace idemgate::storage::pg
