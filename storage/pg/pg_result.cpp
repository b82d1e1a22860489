#include "storage/pg/pg_result.hpp"

#include <charconv>

namespace idemgate::storage::pg {
namespace {

std::uint64_t big_endian(std::string_view bytes) noexcept {
  std::uint64_t value = 0;
  for (const char c : bytes) value = (value << 8) | static_cast<unsigned char>(c);
  return value;
}

// Postgres timestamps count from 2000-01-01T00:00:00Z.
constexpr std::chrono::sys_seconds kPostgresEpoch{std::chrono::seconds(946'684'800)};

}  // namespace

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

std::optional<std::string_view> PgResult::fixed(int row, int column,
                                                std::size_t size) const noexcept {
  if (is_null(row, column)) return std::nullopt;
  const auto value = bytes(row, column);
  if (value.size() != size) return std::nullopt;
  return value;
}

std::optional<bool> PgResult::boolean(int row, int column) const noexcept {
  const auto value = fixed(row, column, 1);
  if (!value) return std::nullopt;
  return (*value)[0] != 0;
}

std::optional<std::int32_t> PgResult::int4(int row, int column) const noexcept {
  const auto value = fixed(row, column, 4);
  if (!value) return std::nullopt;
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(big_endian(*value)));
}

std::optional<std::int64_t> PgResult::int8(int row, int column) const noexcept {
  const auto value = fixed(row, column, 8);
  if (!value) return std::nullopt;
  return static_cast<std::int64_t>(big_endian(*value));
}

std::optional<std::chrono::system_clock::time_point> PgResult::timestamptz(
    int row, int column) const noexcept {
  const auto micros = int8(row, column);
  if (!micros) return std::nullopt;
  return std::chrono::time_point_cast<std::chrono::system_clock::duration>(
      kPostgresEpoch + std::chrono::microseconds(*micros));
}

}  // namespace idemgate::storage::pg
