#include "storage/pg/migrations.hpp"

#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <set>
#include <string>

#include "storage/pg/embedded_migrations.hpp"

namespace idemgate::storage::pg {
namespace {

using core::store_errc;

// Any constant works as long as every gateway uses the same one: it names the lock in the
// database-wide advisory lock space.
constexpr const char* kMigrationLock = "SELECT pg_advisory_lock(7318041992100651521)";
constexpr const char* kMigrationUnlock = "SELECT pg_advisory_unlock(7318041992100651521)";

struct Finish {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
struct Clear {
  void operator()(PGresult* result) const noexcept { PQclear(result); }
};
using Connection = std::unique_ptr<PGconn, Finish>;
using Result = std::unique_ptr<PGresult, Clear>;

std::string_view trimmed(const char* message) {
  std::string_view text = message ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text;
}

void forward_notice(void*, const char* message) {
  spdlog::info("postgres: {}", trimmed(message));
}

// Runs `sql` (several statements allowed when there are no parameters) and checks its status.
boost::system::result<Result> run(PGconn* conn, const char* what, const char* sql,
                                  const std::string* param = nullptr) {
  const char* values[] = {param ? param->c_str() : nullptr};
  Result result(param ? PQexecParams(conn, sql, 1, nullptr, values, nullptr, nullptr, 0)
                      : PQexec(conn, sql));
  const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
  const char* message = result ? PQresultErrorMessage(result.get()) : PQerrorMessage(conn);
  spdlog::error("migrations: {} failed: {}", what, trimmed(message));
  if (PQstatus(conn) == CONNECTION_BAD) return store_errc::unavailable;
  return store_errc::protocol;
}

boost::system::result<int> apply_pending(PGconn* conn) {
  auto created = run(conn, "creating schema_migrations",
                     "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version integer PRIMARY KEY,"
                     " applied_at timestamptz NOT NULL DEFAULT now())");
  if (!created) return created.error();
  auto rows = run(conn, "reading schema_migrations", "SELECT version FROM schema_migrations");
  if (!rows) return rows.error();
  std::set<int> done;
  for (int i = 0; i < PQntuples(rows->get()); ++i) {
    done.insert(std::stoi(PQgetvalue(rows->get(), i, 0)));
  }

  int applied = 0;
  for (const Migration& migration : embedded_migrations()) {
    if (done.contains(migration.version)) continue;
    const std::string sql(migration.sql);
    const std::string version = std::to_string(migration.version);
    auto began = run(conn, "BEGIN", "BEGIN");
    if (!began) return began.error();
    auto step = run(conn, migration.name.data(), sql.c_str());
    if (step) {
      step = run(conn, "recording the migration",
                 "INSERT INTO schema_migrations (version) VALUES ($1::int4)", &version);
    }
    if (step) step = run(conn, "COMMIT", "COMMIT");
    if (!step) {
      Result rollback(PQexec(conn, "ROLLBACK"));
      return step.error();
    }
    spdlog::info("migrations: applied {}", migration.name);
    ++applied;
  }
  return applied;
}

}  // namespace

std::span<const Migration> embedded_migrations() noexcept {
  return detail::kEmbeddedMigrations;
}

boost::system::result<int> apply_migrations(std::string_view dsn) {
  const std::string conninfo(dsn);
  // Entries before the expanded dbname are overridden by the DSN's own settings.
  const char* keys[] = {"fallback_application_name", "dbname", nullptr};
  const char* values[] = {"idemgate-migrate", conninfo.c_str(), nullptr};
  Connection conn(PQconnectdbParams(keys, values, /*expand_dbname=*/1));
  if (!conn) return store_errc::unavailable;
  PQsetNoticeProcessor(conn.get(), &forward_notice, nullptr);
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    spdlog::error("migrations: cannot connect: {}", trimmed(PQerrorMessage(conn.get())));
    return store_errc::unavailable;
  }

  // `CREATE TABLE IF NOT EXISTS` notices are not news.
  auto quiet = run(conn.get(), "SET client_min_messages", "SET client_min_messages = warning");
  if (!quiet) return quiet.error();
  // Held until unlock or disconnect, so a crashed migrator never leaves it behind.
  auto locked = run(conn.get(), "taking the migration lock", kMigrationLock);
  if (!locked) return locked.error();
  auto applied = apply_pending(conn.get());
  run(conn.get(), "releasing the migration lock", kMigrationUnlock);
  return applied;
}

}  // namespace idemgate::storage::pg
