#include "storage/pg/migrations.hpp"

#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

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
// Parameters go as text.
boost::system::result<Result> run(PGconn* conn, const char* what, const char* sql,
                                  const std::vector<std::string>& params = {}) {
  std::vector<const char*> values;
  for (const auto& param : params) values.push_back(param.c_str());
  Result result(params.empty() ? PQexec(conn, sql)
                               : PQexecParams(conn, sql, static_cast<int>(values.size()), nullptr,
                                              values.data(), nullptr, nullptr, 0));
  const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
  const char* message = result ? PQresultErrorMessage(result.get()) : PQerrorMessage(conn);
  spdlog::error("migrations: {} failed: {}", what, trimmed(message));
  if (PQstatus(conn) == CONNECTION_BAD) return store_errc::unavailable;
  return store_errc::protocol;
}

// The first statements of every migration transaction: quiet notices (`CREATE TABLE IF NOT
// EXISTS` is not news; LOCAL ends with the transaction, so no session state stays behind a
// pooler), then the migration lock, held until COMMIT or ROLLBACK.
boost::system::result<Result> begin_locked(PGconn* conn) {
  auto began = run(conn, "BEGIN", "BEGIN");
  if (!began) return began.error();
  auto quiet = run(conn, "SET client_min_messages", "SET LOCAL client_min_messages = warning");
  if (!quiet) return quiet.error();
  return run(conn, "taking the migration lock", kMigrationLock);
}

// Inside a transaction that holds the migration lock: creates schema_migrations if missing and
// applies the first migration not recorded there, with its row. Returns how many it applied: 1,
// or 0 when none is pending.
boost::system::result<int> apply_next_locked(PGconn* conn) {
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
               "INSERT INTO schema_migrations (version) VALUES ($1::int4)", {version});
    if (!step) return step.error();
    spdlog::info("migrations: applied {}", migration.name);
    return 1;
  }
  return 0;
}

// One transaction: the lock, then at most one migration. Returns how many it applied (0 or 1).
boost::system::result<int> apply_next(PGconn* conn) {
  auto began = begin_locked(conn);
  auto applied = began ? apply_next_locked(conn) : boost::system::result<int>(began.error());
  if (!applied) {
    Result rollback(PQexec(conn, "ROLLBACK"));
    return applied.error();
  }
  auto committed = run(conn, "COMMIT", "COMMIT");
  if (!committed) return committed.error();
  return *applied;
}

// Each migration in its own transaction, which also holds the lock (apply_next): nothing of
// this session outlives a transaction, so a transaction pooler in between is harmless.
boost::system::result<int> apply_pending(PGconn* conn) {
  int applied = 0;
  for (;;) {
    auto next = apply_next(conn);
    if (!next) return next.error();
    if (*next == 0) break;
    applied += *next;
  }
  return applied;
}

// The table as the catalog sees it. partitioned: relkind 'p'; key: pg_get_partkeydef, e.g.
// `HASH (id)`; partitions: direct children; matching: children whose bound is modulus $1.
constexpr const char* kInspectRecords =
    "SELECT c.oid, quote_ident(n.nspname), c.relkind = 'p',"
    " coalesce(pg_get_partkeydef(c.oid), ''),"
    " (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid),"
    " (SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid"
    "   WHERE i.inhparent = c.oid AND pg_get_expr(p.relpartbound, p.oid)"
    "     LIKE 'FOR VALUES WITH (modulus ' || $1 || ', remainder %')"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass('idempotency_record')";

// The statements that give the new parent ($2) and each of its partitions the owner and grants
// of the old table ($1), as psql's \gexec would run them: a table created here belongs to
// whoever runs the migration, which need not be the role the gateways use.
constexpr const char* kCopyOwnerAndGrants =
    "WITH targets AS ("
    "  SELECT $2::oid AS rel UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = $2::oid),"
    " old AS (SELECT relowner, relacl FROM pg_class WHERE oid = $1::oid)"
    " SELECT format('ALTER TABLE %s OWNER TO %I', t.rel::regclass, pg_get_userbyid(old.relowner))"
    " FROM targets t, old"
    " WHERE old.relowner <> (SELECT relowner FROM pg_class WHERE oid = t.rel)"
    " UNION ALL"
    " SELECT format('GRANT %s ON TABLE %s TO %s%s', a.privilege_type, t.rel::regclass,"
    "   CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,"
    "   CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)"
    " FROM targets t, old, aclexplode(old.relacl) a"
    " WHERE a.grantee <> old.relowner";

struct TableState {
  std::string oid;
  std::string schema;  // quoted
  bool partitioned = false;
  std::string key;
  int partitions = 0;
  int matching = 0;  // partitions whose bound has modulus N
};

boost::system::result<TableState> inspect(PGconn* conn, int partitions) {
  auto rows = run(conn, "reading idempotency_record from the catalog", kInspectRecords,
                  {std::to_string(partitions)});
  if (!rows) return rows.error();
  if (PQntuples(rows->get()) != 1) {
    spdlog::error("migrations: idempotency_record not found on the search_path");
    return store_errc::protocol;
  }
  PGresult* r = rows->get();
  TableState state;
  state.oid = PQgetvalue(r, 0, 0);
  state.schema = PQgetvalue(r, 0, 1);
  state.partitioned = PQgetvalue(r, 0, 2) == std::string_view("t");
  state.key = PQgetvalue(r, 0, 3);
  state.partitions = std::stoi(PQgetvalue(r, 0, 4));
  state.matching = std::stoi(PQgetvalue(r, 0, 5));
  return state;
}

// The conversion of a plain table, inside the caller's transaction. Returns the rows moved.
boost::system::result<std::int64_t> convert(PGconn* conn, const TableState& state, int partitions) {
  const std::string table = state.schema + ".idempotency_record";
  const std::string old_table = state.schema + ".idempotency_record_unpartitioned";
  std::string sql = "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE;";
  sql += "ALTER TABLE " + table + " RENAME TO idempotency_record_unpartitioned;";
  // The old index names go aside first: LIKE names the new indexes after the new table, and
  // they must keep the names migration 001 gave (later migrations may refer to them).
  sql += "ALTER INDEX IF EXISTS " + state.schema + ".idempotency_record_pkey";
  sql += " RENAME TO idempotency_record_unpartitioned_pkey;";
  sql += "ALTER INDEX IF EXISTS " + state.schema + ".idempotency_record_expires_at_idx";
  sql += " RENAME TO idempotency_record_unpartitioned_expires_at_idx;";
  // INCLUDING ALL: columns, defaults, CHECKs, the primary key (it holds the partition key id,
  // so Postgres keeps id unique across partitions and ON CONFLICT (id) arbitrates as before)
  // and every index; each partition created below gets its own copy of each index.
  sql += "CREATE TABLE " + table + " (LIKE " + old_table + " INCLUDING ALL)";
  sql += " PARTITION BY HASH (id);";
  const std::string modulus = std::to_string(partitions);
  for (int i = 0; i < partitions; ++i) {
    const std::string remainder = std::to_string(i);
    sql += "CREATE TABLE " + table + "_p" + remainder + " PARTITION OF " + table +
           " FOR VALUES WITH (modulus " + modulus + ", remainder " + remainder + ");";
  }
  auto created = run(conn, "creating the partitions", sql.c_str());
  if (!created) return created.error();

  auto new_oid = run(conn, "reading the new table's oid", "SELECT $1::regclass::oid", {table});
  if (!new_oid) return new_oid.error();
  auto grants = run(conn, "reading the old table's owner and grants", kCopyOwnerAndGrants,
                    {state.oid, PQgetvalue(new_oid->get(), 0, 0)});
  if (!grants) return grants.error();
  for (int i = 0; i < PQntuples(grants->get()); ++i) {
    auto granted = run(conn, "copying the owner and grants", PQgetvalue(grants->get(), i, 0));
    if (!granted) return granted.error();
  }

  // SELECT * matches: LIKE copied the columns in order.
  auto moved =
      run(conn, "moving the rows",
          ("INSERT INTO " + table + " SELECT * FROM " + old_table + " WHERE expires_at > now()")
              .c_str());
  if (!moved) return moved.error();
  const std::int64_t rows = std::stoll(PQcmdTuples(moved->get()));
  auto dropped = run(conn, "dropping the old table", ("DROP TABLE " + old_table).c_str());
  if (!dropped) return dropped.error();
  return rows;
}

boost::system::result<PartitionReport> partition_table(PGconn* conn, int partitions) {
  PartitionReport report;
  auto applied = apply_pending(conn);
  if (!applied) return applied.error();
  report.migrations_applied = *applied;

  // One transaction under the migration lock: gateways starting now wait for the conversion.
  auto began = begin_locked(conn);
  if (!began) {
    Result rollback(PQexec(conn, "ROLLBACK"));
    return began.error();
  }
  auto finish = [&](boost::system::result<PartitionReport> outcome) {
    Result end(PQexec(conn, outcome ? "COMMIT" : "ROLLBACK"));
    if (outcome && (!end || PQresultStatus(end.get()) != PGRES_COMMAND_OK)) {
      spdlog::error("migrations: COMMIT failed: {}", trimmed(PQerrorMessage(conn)));
      return boost::system::result<PartitionReport>(
          PQstatus(conn) == CONNECTION_BAD ? store_errc::unavailable : store_errc::protocol);
    }
    return outcome;
  };
  auto state = inspect(conn, partitions);
  if (!state) return finish(state.error());
  report.existing_partitions = state->partitions;
  report.existing_key = state->key;
  if (state->partitioned) {
    const bool same = state->key == "HASH (id)" && state->partitions == partitions &&
                      state->matching == partitions;
    report.outcome = same ? PartitionReport::Outcome::unchanged : PartitionReport::Outcome::refused;
    return finish(report);
  }
  auto moved = convert(conn, *state, partitions);
  if (!moved) return finish(moved.error());
  report.outcome = PartitionReport::Outcome::converted;
  report.rows_moved = *moved;
  return finish(report);
}

// A connection for migrations, its notices to the log. No session state: each transaction sets
// what it needs (begin_locked).
boost::system::result<Connection> connect(std::string_view dsn) {
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
  return conn;
}

}  // namespace

std::span<const Migration> embedded_migrations() noexcept {
  return detail::kEmbeddedMigrations;
}

boost::system::result<int> apply_migrations(std::string_view dsn) {
  auto conn = connect(dsn);
  if (!conn) return conn.error();
  return apply_pending(conn->get());
}

boost::system::result<PartitionReport> partition_records(std::string_view dsn, int partitions) {
  if (partitions < kMinRecordPartitions || partitions > kMaxRecordPartitions) {
    throw std::invalid_argument("partition_records: partitions must be in 2..1024");
  }
  auto conn = connect(dsn);
  if (!conn) return conn.error();
  return partition_table(conn->get(), partitions);
}

}  // namespace idemgate::storage::pg
