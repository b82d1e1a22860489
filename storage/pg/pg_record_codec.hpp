#pragma once
// The byte forms of `idempotency_record` columns (storage/migrations/001), without libpq: the
// encoded header list, and one row of the record store's SELECT decoded into a StoredRecord.
// PgRecordStore and PgBatchWriter write with these; the stored_record fuzz target exercises them.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/core/hash.hpp"
#include "gateway/core/stored_response.hpp"

namespace idemgate::storage::pg {

/// The `headers` column: a format byte 1, then per field a 4-byte big-endian name length, the
/// name, a 4-byte big-endian value length, the value. Order and repeats are kept.
std::string encode_headers(const std::vector<core::HeaderField>& headers);

/// The inverse of encode_headers. std::nullopt when the blob does not start with the format
/// byte or ends inside a field. The format has no field count: a blob cut right after a whole
/// field decodes to the fields before the cut.
std::optional<std::vector<core::HeaderField>> decode_headers(std::string_view blob);

/// One row of `SELECT route, fingerprint, status, headers, body, body_omitted, created_at,
/// expires_at`, each column as received in binary format; std::nullopt is SQL NULL.
struct RecordColumns {
  std::optional<std::string_view> route;
  std::optional<std::string_view> fingerprint;
  std::optional<std::string_view> status;  ///< int4
  std::optional<std::string_view> headers;
  std::optional<std::string_view> body;
  std::optional<std::string_view> body_omitted;  ///< bool
  std::optional<std::string_view> created_at;    ///< timestamptz
  std::optional<std::string_view> expires_at;    ///< timestamptz
};

/// The record with id `id` that `row` holds, or std::nullopt when the row is malformed: a
/// fingerprint that is not 32 bytes, a status that is not an int4 of 100-599, a header blob
/// decode_headers refuses, a body_omitted that is not a bool, or a timestamp that is not a
/// timestamptz. A NULL route or body reads as empty (the schema has them NOT NULL). Pure.
std::optional<core::StoredRecord> decode_record(const RecordColumns& row, const core::Sha256& id);

}  // namespace idemgate::storage::pg
