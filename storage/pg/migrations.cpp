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
// database-wide advisory lock space. Transaction-scoped: COMMIT or ROLLBACK releases it on the
// server session that took it. A session lock would stay behind a transaction pooler, whose
// next transaction may run on another server session, and block every later start (SPEC C44).
constexpr const char* kMigrationLock = "SELECT pg_advisory_xact_lock(7318041992100651521)";

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

// Inside a transaction that holds the migration lock: creates schema_migrations if missing and
// applies the first migration not recorded there, with its row. Returns how many it applied: 1,
// or 0 when none is pending.
boost::system::result<int> apply_next_locked(PGconn* conn) {
  // `CREATE TABLE IF NOT EXISTS` notices are not news; LOCAL ends with the transaction.
  auto quiet = run(conn, "SET client_min_messages", "SET LOCAL client_min_messages = warning");
  if (!quiet) return quiet.error();
  auto locked = run(conn, "taking the migration lock", kMigrationLock);
  if (!locked) return locked.error();
  auto created = run(conn, "creating schema_migrations",
                     "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version integer PRIMARY KEY,"
                     " applied_at timestamptz NOT NULL DEFAULT now())");
  if (!created) return created.error();
  // Read under the lock: a process that applied migrations before us has committed them.
  auto rows = run(conn, "reading schema_migrations", "SELECT version FROM schema_migrations");
  if (!rows) return rows.error();
  std::set<int> done;
  for (int i = 0; i < PQntuples(rows->get()); ++i) {
    done.insert(std::stoi(PQgetvalue(rows->get(), i, 0)));
  }
  for (const Migration& migration : embedded_migrations()) {
    if (done.contains(migration.version)) continue;
    const std::string sql(migration.sql);
    const std::string version = std::to_string(migration.version);
    auto step = run(conn, migration.name.data(), sql.c_str());
    if (!step) return step.error();
    step = run(conn, "recording the migration",
               "INSERT INTO schema_migrations (version) VALUES ($1::int4)", &version);
    if (!step) return step.error();
    spdlog::info("migrations: applied {}", migration.name);
    return 1;
  }
  return 0;
}

// One transaction: the lock, then at most one migration. Returns how many it applied (0 or 1).
boost::system::result<int> apply_next(PGconn* conn) {
  auto began = run(conn, "BEGIN", "BEGIN");
  if (!began) return began.error();
  auto applied = apply_next_locked(conn);
  if (!applied) {
    Result rollback(PQexec(conn, "ROLLBACK"));
    return applied.error();
  }
  auto committed = run(conn, "COMMIT", "COMMIT");
  if (!committed) return committed.error();
  return *applied;
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

  // Each migration in its own transaction, which also holds the lock (apply_next): nothing of
  // this session outlives a transaction, so a transaction pooler in between is harmless.
  int applied = 0;
  for (;;) {
    auto next = apply_next(conn.get());
    if (!next) return next.error();
    if (*next == 0) break;
    applied += *next;
  }
  return applied;
}

}  // namespace idemgate::storage::pg
