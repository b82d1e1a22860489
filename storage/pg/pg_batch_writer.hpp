#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_statement_batch.hpp"

namespace idemgate::storage::pg {

/// One `idempotency_record` row as it goes on the wire: byte strings already encoded the way the
/// table stores them (PgRecordStore does the encoding).
struct RecordRow {
  std::string id;           ///< 32 bytes
  std::string route;        ///< UTF-8
  std::string fingerprint;  ///< 32 bytes
  std::int32_t status = 0;
  std::string headers;  ///< the table's header encoding (format byte 1, …)
  std::string body;
  bool body_omitted = false;
  std::int64_t ttl_ms = 0;  ///< expires_at = the database's now() + ttl_ms
};

/// Group commit for record inserts of one io thread. Concurrent insert() calls are queued; a
/// batch goes out as one statement (`INSERT … SELECT FROM unnest($1::bytea[], …) ON CONFLICT
/// (id) DO UPDATE … WHERE expires_at <= now() RETURNING id`), so one round trip and one commit
/// (one WAL flush) serve the whole batch. A batch leaves at once while fewer than
/// Options::max_in_flight are out, else as soon as one of them returns: under load, the
/// requests that arrived during a commit ride on the next one; with a single caller, a batch
/// of one leaves at once (no added delay).
///
/// Each row is inserted exactly as PgRecordStore's single-row insert would: it replaces only an
/// expired row and leaves a live one alone. Two rows with the same id never share a batch (the
/// later one waits for the next), since one statement may not touch a row twice.
///
/// @par Errors
/// Per call, as `core::store_errc`: `timed_out` when `deadline` passes before the call's batch
/// returned (the row may still have been written, as for any timed-out statement); the batch's
/// error (`unavailable`, `timed_out`, `protocol`) for every call in a batch that failed.
///
/// @par Cancellation
/// A caller that stops waiting is dropped from the queue if its batch has not left yet;
/// otherwise its row is written and the answer discarded.
///
/// @par Thread safety
/// None: one writer per io thread, over that thread's pool, which must outlive it. Batches
/// already sent finish after the writer is destroyed; queued calls are not sent.
class PgBatchWriter {
 public:
  using Options = StatementBatch::Options;

  PgBatchWriter(boost::asio::any_io_executor executor, PgPool& pool, Options options);
  ~PgBatchWriter();
  PgBatchWriter(const PgBatchWriter&) = delete;
  PgBatchWriter& operator=(const PgBatchWriter&) = delete;

  /// Inserts `row` in the next batch. true: the row is now stored (inserted, or it replaced an
  /// expired one); false: a live row with the same id blocked it and nothing changed (C36: the
  /// caller reads that row).
  boost::asio::awaitable<boost::system::result<bool>> insert(RecordRow row, Deadline deadline);

  /// Statements sent so far, and rows they carried (for tests and the benchmark).
  std::uint64_t batches_sent() const noexcept;
  std::uint64_t rows_sent() const noexcept;

 private:
  StatementBatch batch_;
};

}  // namespace idemgate::storage::pg
