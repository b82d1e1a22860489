#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_result.hpp"
#include "storage/pg/pg_statement_batch.hpp"

namespace idemgate::storage::pg {

/// What PgBatchReader::find() found: the batch's result, shared by every caller it answers,
/// and the caller's row in it.
struct FoundRow {
  std::shared_ptr<const PgResult> rows;  ///< null: no row with the id
  int row = -1;
};

/// Batched lookups by id for one io thread: concurrent find() calls share one statement and one
/// round trip (StatementBatch: a batch leaves at once while fewer than max_in_flight are out,
/// so a lone caller waits for nobody). `statement` takes the batch's ids as `$1`, a `bytea[]`,
/// and returns at most one row per id with the id as its last column, e.g. `SELECT …, id FROM t
/// WHERE id = ANY($1::bytea[])`.
///
/// @par Errors
/// Per call, as `core::store_errc`: `timed_out` when `deadline` passes before the call's batch
/// returned; the batch's error (`unavailable`, `timed_out`, `protocol`) for every call in a
/// batch that failed.
///
/// @par Thread safety
/// None: one reader per io thread, over that thread's pool, which must outlive it.
class PgBatchReader {
 public:
  using Options = StatementBatch::Options;

  PgBatchReader(boost::asio::any_io_executor executor, PgPool& pool, Statement statement,
                Options options);

  /// The row whose id is `id` (bytes), if any, by `deadline`.
  boost::asio::awaitable<boost::system::result<FoundRow>> find(std::string id, Deadline deadline);

  /// Statements sent so far, and the lookups they carried (for tests and the benchmark).
  std::uint64_t batches_sent() const noexcept;
  std::uint64_t lookups_sent() const noexcept;

 private:
  StatementBatch batch_;
};

}  // namespace idemgate::storage::pg
