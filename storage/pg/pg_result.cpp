#include "storage/pg/pg_result.hpp"

#include <charconv>

#include "storage/pg/pg_binary.hpp"

namespace idemgate::storage::pg {

int PgResult::rows() const noexcept {
  return result_ ? PQntuples(result_.get()) : 0;
}

int PgResult::columns() const noexcept {
  return result_ ? PQnfields(result_.get()) : 0;
}

std::int64_t PgResult::affected_rows() const noexcept {
  if (!result_) return 0;
  const std::string_view text = PQcmdTuples(result_.get());
  std::int64_t count = 0;
  std::from_chars(text.data(), text.data() + text.size(), count);
  return count;
}

bool PgResult::is_null(int row, int column) const noexcept {
  return !result_ || PQgetisnull(result_.get(), row, column) != 0;
}

std::string_view PgResult::bytes(int row, int column) const noexcept {
  if (is_null(row, column)) return {};
  return {PQgetvalue(result_.get(), row, column),
          static_cast<std::size_t>(PQgetlength(result_.get(), row, column))};
}

std::optional<bool> PgResult::boolean(int row, int column) const noexcept {
  return is_null(row, column) ? std::nullopt : binary::boolean(bytes(row, column));
}

std::optional<std::int32_t> PgResult::int4(int row, int column) const noexcept {
  return is_null(row, column) ? std::nullopt : binary::int4(bytes(row, column));
}

std::optional<std::int64_t> PgResult::int8(int row, int column) const noexcept {
  return is_null(row, column) ? std::nullopt : binary::int8(bytes(row, column));
}

std::optional<std::chrono::system_clock::time_point> PgResult::timestamptz(
    int row, int column) const noexcept {
  return is_null(row, column) ? std::nullopt : binary::timestamptz(bytes(row, column));
}

}  // namespace idemgate::storage::pg
