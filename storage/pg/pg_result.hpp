#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace idemgate::storage::pg {

/// One statement's result, received in binary format (PgConnection asks for binary results).
/// Owns the PGresult. Accessors take zero-based row and column numbers and return std::nullopt
/// when the value is SQL NULL or does not have the binary size of the type asked for, so a
/// schema mismatch shows up as a value the caller rejects, never as an out-of-bounds read.
/// Row and column numbers must be within rows() and columns().
class PgResult {
 public:
  PgResult() = default;
  explicit PgResult(PGresult* result) noexcept : result_(result) {}

  int rows() const noexcept;
  int columns() const noexcept;
  /// Rows changed by INSERT/UPDATE/DELETE (PQcmdTuples); 0 for other statements.
  std::int64_t affected_rows() const noexcept;

  bool is_null(int row, int column) const noexcept;
  /// The raw value (bytea, text: the bytes themselves); empty for NULL.
  std::string_view bytes(int row, int column) const noexcept;
  std::optional<bool> boolean(int row, int column) const noexcept;
  std::optional<std::int32_t> int4(int row, int column) const noexcept;
  std::optional<std::int64_t> int8(int row, int column) const noexcept;
  /// A `timestamptz` (microseconds since 2000-01-01 UTC on the wire).
  std::optional<std::chrono::system_clock::time_point> timestamptz(int row,
                                                                   int column) const noexcept;

 private:
  struct Clear {
    void operator()(PGresult* result) const noexcept { PQclear(result); }
  };
  std::unique_ptr<PGresult, Clear> result_;
};

}  // namespace idemgate::storage::pg
