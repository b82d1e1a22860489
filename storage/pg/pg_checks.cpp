#include "storage/pg/pg_checks.hpp"

#include <algorithm>
#include <string>

#include "storage/pg/migrations.hpp"

namespace idemgate::storage::pg {

namespace asio = boost::asio;
using core::StoreCheck;

asio::awaitable<StoreCheck> check_synchronous_commit(PgPool& pool) {
  StoreCheck check{"postgres synchronous_commit", StoreCheck::Verdict::ok, ""};
  auto rows = co_await pool.query(
      "SELECT current_setting('synchronous_commit'), "
      "current_setting('synchronous_standby_names'), "
      "(SELECT count(*) FROM pg_stat_replication)",
      {});
  if (!rows || rows->rows() != 1) {
    check.verdict = StoreCheck::Verdict::warning;
    check.detail =
        "could not run: " + (rows ? std::string("unexpected answer") : rows.error().message());
    co_return check;
  }
  const std::string value(rows->bytes(0, 0));
  const bool standby_names = !rows->bytes(0, 1).empty();
  const auto standbys = rows->int8(0, 2).value_or(0);
  if (value == "off") {
    check.verdict = StoreCheck::Verdict::warning;
    check.detail =
        "synchronous_commit is off: a crash of the Postgres server can lose records whose "
        "answers were sent, and their retries execute again";
  } else if (value == "local" && (standby_names || standbys > 0)) {
    check.verdict = StoreCheck::Verdict::warning;
    check.detail =
        "synchronous_commit is local on a server with standbys: a failover can lose records "
        "whose answers were sent; use on or remote_apply";
  } else {
    check.detail = "synchronous_commit is " + value;
  }
  co_return check;
}

asio::awaitable<StoreCheck> check_schema_version(PgPool& pool) {
  StoreCheck check{"postgres schema version", StoreCheck::Verdict::ok, ""};
  const auto migrations = embedded_migrations();
  const int known = migrations.empty() ? 0 : migrations.back().version;
  auto rows = co_await pool.query("SELECT to_regclass('schema_migrations') IS NOT NULL", {});
  if (!rows || rows->rows() != 1) {
    check.verdict = StoreCheck::Verdict::warning;
    check.detail =
        "could not run: " + (rows ? std::string("unexpected answer") : rows.error().message());
    co_return check;
  }
  int found = 0;
  if (rows->boolean(0, 0).value_or(false)) {
    auto version =
        co_await pool.query("SELECT coalesce(max(version), 0) FROM schema_migrations", {});
    if (!version || version->rows() != 1 || !version->int4(0, 0)) {
      check.verdict = StoreCheck::Verdict::warning;
      check.detail = "could not run: " +
                     (version ? std::string("unexpected answer") : version.error().message());
      co_return check;
    }
    found = *version->int4(0, 0);
  }
  if (found < known) {
    check.verdict = StoreCheck::Verdict::failed;
    check.detail = "the schema is at version " + std::to_string(found) + ", this idemgate needs " +
                   std::to_string(known) + ": run idemgate migrate --config FILE";
  } else if (found > known) {
    check.verdict = StoreCheck::Verdict::failed;
    check.detail = "the schema is at version " + std::to_string(found) +
                   ", newer than this idemgate knows (" + std::to_string(known) +
                   "): it was migrated by a newer release; run that release";
  } else {
    check.detail = "version " + std::to_string(found);
  }
  co_return check;
}

}  // namespace idemgate::storage::pg
