#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>
#include <chrono>
#include <optional>

#include "gateway/core/errors.hpp"
#include "gateway/core/stored_response.hpp"

namespace idemgate::core {

/// Result of RecordStore::insert.
struct InsertResult {
  bool inserted = false;                 ///< true: this call's record is now the stored one
  std::optional<StoredRecord> existing;  ///< set when !inserted: the live record that won (C36)
};

/// The durable store of completed responses (SPEC C15, C16, C24, C36). One instance per io
/// thread; not thread-safe. Every operation ends within the store's operation_timeout.
///
/// Errors (as `store_errc` conditions): `unavailable` (no connection could be had),
/// `timed_out` (the operation ran past operation_timeout; the connection is discarded),
/// `protocol`. If the caller stops waiting (its coroutine is destroyed), the operation's
/// connection is discarded, never reused mid-statement.
class RecordStore {
 public:
  virtual ~RecordStore() = default;

  /// The live record with this id: absent, or present with expires_at > the store's now()
  /// (expired records are treated as absent at once, C24). Read-only, idempotent.
  virtual boost::asio::awaitable<boost::system::result<std::optional<StoredRecord>>> find(
      Sha256 id) = 0;

  /// Stores `record` with expires_at = now() + ttl unless a live record with the same id exists
  /// (`INSERT … ON CONFLICT`, C36): then nothing changes and the existing record is returned.
  /// An expired record with the same id is replaced. Idempotent for equal records.
  virtual boost::asio::awaitable<boost::system::result<InsertResult>> insert(
      StoredRecord record, std::chrono::milliseconds ttl) = 0;
};

}  // namespace idemgate::core
