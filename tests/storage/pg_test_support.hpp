#pragma once
// Helpers shared by the Postgres store suites (IDEMGATE_PG_DSN; a suite fails when it is unset).

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "gateway/core/hash.hpp"
#include "storage/pg/migrations.hpp"
#include "storage/pg/pg_connection.hpp"
#include "storage/pg/pg_pool.hpp"

namespace idemgate::testing {

/// The DSN of the test database; throws (so the suite fails, not skips) when it is not set.
inline std::string pg_dsn() {
  const char* dsn = std::getenv("IDEMGATE_PG_DSN");
  if (!dsn || !*dsn) {
    throw std::runtime_error("IDEMGATE_PG_DSN is not set; start stores with scripts/local-stores");
  }
  return dsn;
}

/// The digest's bytes, as a bytea parameter takes them.
inline std::string bytes_of(const core::Sha256& digest) {
  return {reinterpret_cast<const char*>(digest.data()), digest.size()};
}

/// A generous deadline (10 s) for set-up statements.
inline storage::pg::Deadline soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(10);
}

/// The suite's schema, applied once before any case runs (a global fixture).
struct MigratedDatabase {
  MigratedDatabase() {
    auto applied = storage::pg::apply_migrations(pg_dsn());
    if (!applied) throw std::runtime_error("apply_migrations: " + applied.error().message());
  }
};

/// Sleeps on the database until its clock passes the record's expires_at: the store judges
/// expiry by that clock, not by this process's.
inline boost::asio::awaitable<void> wait_until_db_clock_passes_expiry(storage::pg::PgPool& pool,
                                                                      core::Sha256 id) {
  std::vector<storage::pg::Param> params;
  params.push_back(storage::pg::Param::bytes(bytes_of(id)));
  auto slept = co_await pool.query(
      "SELECT pg_sleep(GREATEST(0, EXTRACT(EPOCH FROM expires_at - clock_timestamp()))::float8)"
      " FROM idempotency_record WHERE id = $1",
      std::move(params));
  if (!slept) throw std::runtime_error("wait_until_expired: " + slept.error().message());
}

}  // namespace idemgate::testing
