#pragma once

#include <boost/system/result.hpp>
#include <span>
#include <string_view>

#include "gateway/core/errors.hpp"

namespace idemgate::storage::pg {

/// A schema migration compiled into the binary from storage/migrations/NNN_name.sql.
struct Migration {
  int version;            ///< NNN
  std::string_view name;  ///< file name
  std::string_view sql;   ///< file contents; may hold several statements
};

/// The embedded migrations, in ascending version order.
std::span<const Migration> embedded_migrations() noexcept;

/// Applies every embedded migration not yet listed in `schema_migrations` (created if missing),
/// in version order, each in its own transaction together with its `schema_migrations` row.
/// Several processes may run this at once: each of those transactions first takes a
/// transaction-scoped `pg_advisory_xact_lock`, so each migration is applied exactly once. No
/// session state outlives a transaction, so this works through a transaction pooler such as
/// PgBouncer with `pool_mode = transaction` (SPEC C44). Tables are created in the first schema
/// of the connection's search_path.
///
/// Blocking (libpq synchronous calls): for start-up and `idemgate migrate` (SPEC §1), never on
/// an io thread. Returns the number of migrations applied (0: already up to date).
/// Errors: store_errc::unavailable (cannot connect or the connection broke),
/// store_errc::protocol (a statement failed; that migration is rolled back). Details are logged.
boost::system::result<int> apply_migrations(std::string_view dsn);

}  // namespace idemgate::storage::pg
