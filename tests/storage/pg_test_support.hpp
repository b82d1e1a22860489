#pragma once
// Helpers shared by the Postgres store suites (IDEMGATE_PG_DSN; a suite fails when it is unset).

#include <libpq-fe.h>

#include <boost/asio/awaitable.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
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

/// Blocking one-off statement on a fresh connection (test set-up only); returns the first value
/// of the first row, or "" when there is none.
inline std::string exec_blocking(const std::string& dsn, const std::string& sql) {
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdb(dsn.c_str()), &PQfinish);
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error(std::string("connect: ") + PQerrorMessage(conn.get()));
  }
  PQsetNoticeProcessor(
      conn.get(), [](void*, const char*) {}, nullptr);
  std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(conn.get(), sql.c_str()), &PQclear);
  const auto status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(sql + ": " + PQresultErrorMessage(result.get()));
  }
  return PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
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

/// A schema of its own, first on the search_path of `dsn` (pg_dsn() with an `options` query
/// parameter: a URI DSN), dropped with its content afterwards.
struct ScratchSchema {
  ScratchSchema() : name("migration_test_" + core::random_token().substr(0, 12)) {
    exec_blocking(pg_dsn(), "CREATE SCHEMA " + name);
    const std::string base = pg_dsn();
    dsn = base + (base.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" +
          name;
  }
  ~ScratchSchema() {
    try {
      exec_blocking(pg_dsn(), "DROP SCHEMA " + name + " CASCADE");
    } catch (const std::exception& e) {
      BOOST_TEST_MESSAGE("dropping " << name << ": " << e.what());
    }
  }
  std::string name;
  std::string dsn;
};

}  // namespace idemgate::testing
