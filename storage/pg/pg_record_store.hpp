#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/core/record_store.hpp"
#include "storage/pg/pg_batch_reader.hpp"
#include "storage/pg/pg_batch_writer.hpp"
#include "storage/pg/pg_pool.hpp"

namespace idemgate::storage::pg {

/// core::RecordStore on the `idempotency_record` table (storage/migrations/001). Expiry is
/// judged by the database clock: expires_at = now() + ttl is computed in SQL, and a row is live
/// while expires_at > now(), so gateways with skewed clocks agree (C24). Each operation runs on
/// one pooled connection and ends within the pool's operation_timeout, with the error contract
/// of core::RecordStore; insert() may also return `conflict` if it keeps losing races against
/// concurrent writers of the same id (three attempts).
///
/// @par Thread safety
/// As PgPool: one store per io thread, over that thread's pool, which must outlive it.
class PgRecordStore final : public core::RecordStore {
 public:
  struct Options {
    /// Route insert() through a PgBatchWriter (group commit): concurrent inserts of this
    /// thread share one statement and one commit. Results and errors are those of the
    /// single-row insert; records with a body over `batch_max_body` bytes go one by one.
    bool group_commit = false;
    std::size_t batch_max_body = 64 * 1024;
    PgBatchWriter::Options batch;
    /// Route find() through a PgBatchReader: concurrent lookups of this thread share one
    /// statement (`WHERE id = ANY($1)`) and one round trip. Results and errors are find()'s.
    bool batch_lookups = false;
    PgBatchReader::Options lookup;
  };

  /// Options with group_commit and batch_lookups on and every other field at its default.
  static Options with_group_commit() {
    Options options;
    options.group_commit = true;
    options.batch_lookups = true;
    return options;
  }

  explicit PgRecordStore(PgPool& pool);
  /// `executor` is the pool's (the io thread's), on which the batch writer runs.
  PgRecordStore(PgPool& pool, boost::asio::any_io_executor executor, Options options);
  ~PgRecordStore() override;

  /// `SELECT … WHERE id = $1 AND expires_at > now()` (with batch_lookups: `id = ANY($1)` for
  /// the lookups of one batch).
  boost::asio::awaitable<boost::system::result<std::optional<core::StoredRecord>>> find(
      core::Sha256 id) override;

  /// `INSERT … ON CONFLICT (id) DO UPDATE … WHERE expires_at <= now()`: replaces only an
  /// expired row. When a live row blocks the insert, it is read and returned (C36).
  /// After `timed_out` the row may still have been written (the server can finish a statement
  /// its client gave up on); inserting the same record again then returns inserted = false
  /// with that record.
  boost::asio::awaitable<boost::system::result<core::InsertResult>> insert(
      core::StoredRecord record, std::chrono::milliseconds ttl) override;

  /// `DELETE … WHERE id = $1`: removes the record with this id, live or expired (an operator's
  /// purge, `idemgate keys purge`); true when there was one. A request in flight for the id is
  /// not affected and may insert its record afterwards. Idempotent.
  boost::asio::awaitable<boost::system::result<bool>> purge(core::Sha256 id);

  /// Deletes up to `batch` expired rows (rows locked by a concurrent writer are skipped) and
  /// returns how many it deleted, so a cleaner can repeat until it gets fewer than `batch`
  /// without holding long locks (C24). Idempotent.
  boost::asio::awaitable<boost::system::result<std::int64_t>> delete_expired(int batch);

  /// The partitions of the table once `idemgate migrate --partitions N` has converted it, as
  /// names the server quoted (regclass text, schema-qualified when off the search_path), in
  /// creation order; empty while the table is not partitioned. One catalog query
  /// (pg_partitioned_table, pg_inherits), an unnamed statement in either prepared_statements
  /// mode. Idempotent.
  boost::asio::awaitable<boost::system::result<std::vector<std::string>>> partitions();

  /// delete_expired(batch) on one partition (a name from partitions()) alone: it reads that
  /// partition's expires_at index and locks only that partition. An unnamed statement (the
  /// name is part of its text), so it works in either prepared_statements mode. Idempotent.
  boost::asio::awaitable<boost::system::result<std::int64_t>> delete_expired(int batch,
                                                                             std::string partition);

  /// The group-commit writer, or nullptr when Options::group_commit is off.
  const PgBatchWriter* batch_writer() const noexcept { return batch_.get(); }
  /// The lookup batcher, or nullptr when Options::batch_lookups is off.
  const PgBatchReader* batch_reader() const noexcept { return lookups_.get(); }

 private:
  boost::asio::awaitable<boost::system::result<core::InsertResult>> insert_one(
      core::StoredRecord record, std::chrono::milliseconds ttl, Deadline deadline);

  PgPool& pool_;
  Options options_;
  std::unique_ptr<PgBatchReader> lookups_;
  std::unique_ptr<PgBatchWriter> batch_;
};

}  // namespace idemgate::storage::pg
