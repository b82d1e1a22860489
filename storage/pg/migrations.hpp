#pragma once

#include <boost/system/result.hpp>
#include <cstdint>
#include <span>
#include <string>
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

/// The partition counts `idemgate migrate --partitions N` accepts.
inline constexpr int kMinRecordPartitions = 2;
inline constexpr int kMaxRecordPartitions = 1024;

/// What partition_records() found and did.
struct PartitionReport {
  enum class Outcome {
    converted,  ///< the table was a plain one and is now hash-partitioned into N partitions
    unchanged,  ///< it already was `HASH (id)` with N partitions of modulus N: nothing done
    refused,    ///< it is partitioned some other way (another N, another key): nothing done
  };
  Outcome outcome = Outcome::unchanged;
  int migrations_applied = 0;   ///< pending migrations applied first (as apply_migrations)
  int existing_partitions = 0;  ///< partitions found before (0: the table was not partitioned)
  std::string existing_key;     ///< partition key found before, e.g. `HASH (id)`; "" if none
  std::int64_t rows_moved = 0;  ///< live rows copied into the partitions (converted only)
};

/// Applies pending migrations (as apply_migrations), then converts `idempotency_record` into a
/// table `PARTITION BY HASH (id)` with `partitions` partitions `idempotency_record_p0` …
/// `_p{N-1}` (`FOR VALUES WITH (modulus N, remainder i)`), all under the migration advisory lock.
/// The conversion is one transaction: it takes an ACCESS EXCLUSIVE lock on the table (keyed
/// requests wait for it), renames the table aside, creates the partitioned one `LIKE` it
/// (columns, defaults, CHECKs, the primary key on id, the expires_at index; each partition gets
/// its own), gives the new tables the old one's owner and grants, copies the live rows (expired
/// ones are already absent, SPEC C24, and are left out) and drops the old table. A failure rolls
/// all of it back. The state is read from the catalog (pg_partitioned_table, pg_inherits), so a
/// second run with the same N finds Outcome::unchanged; N cannot be changed in place.
///
/// Blocking (libpq synchronous calls): for `idemgate migrate --partitions N`, never on an io
/// thread. Precondition: kMinRecordPartitions <= partitions <= kMaxRecordPartitions (else
/// std::invalid_argument). Errors: as apply_migrations. Details are logged.
boost::system::result<PartitionReport> partition_records(std::string_view dsn, int partitions);

}  // namespace idemgate::storage::pg
