#pragma once
// Values of Postgres's binary wire format (big-endian, fixed sizes), decoded without libpq, so
// that PgResult and the pure row decoders (pg_record_codec.hpp) share one definition.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace idemgate::storage::pg::binary {

/// The unsigned big-endian number in `bytes` (at most 8 of them).
inline std::uint64_t big_endian(std::string_view bytes) noexcept {
  std::uint64_t value = 0;
  for (const char c : bytes) value = (value << 8) | static_cast<unsigned char>(c);
  return value;
}

/// `bool`: one byte, nonzero is true. std::nullopt for any other size.
inline std::optional<bool> boolean(std::string_view value) noexcept {
  if (value.size() != 1) return std::nullopt;
  return value[0] != 0;
}

/// `int4`: four bytes. std::nullopt for any other size.
inline std::optional<std::int32_t> int4(std::string_view value) noexcept {
  if (value.size() != 4) return std::nullopt;
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(big_endian(value)));
}

/// `int8`: eight bytes. std::nullopt for any other size.
inline std::optional<std::int64_t> int8(std::string_view value) noexcept {
  if (value.size() != 8) return std::nullopt;
  return static_cast<std::int64_t>(big_endian(value));
}

/// Postgres timestamps count from 2000-01-01T00:00:00Z.
inline constexpr std::chrono::sys_seconds kPostgresEpoch{std::chrono::seconds(946'684'800)};

/// `timestamptz`: eight bytes of microseconds since kPostgresEpoch. std::nullopt for any other
/// size, and for a time system_clock cannot hold: Postgres sends `infinity` and `-infinity` as
/// the extreme int8 values and keeps years up to 294276, while a nanosecond system_clock ends
/// in 2262.
inline std::optional<std::chrono::system_clock::time_point> timestamptz(
    std::string_view value) noexcept {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  using Duration = std::chrono::system_clock::duration;
  const auto micros = int8(value);
  if (!micros) return std::nullopt;
  // The range of system_clock in whole microseconds, counted from kPostgresEpoch.
  const auto epoch = duration_cast<microseconds>(kPostgresEpoch.time_since_epoch());
  const auto last = duration_cast<microseconds>(Duration::max()) - epoch;
  const auto first = duration_cast<microseconds>(Duration::min()) - epoch;
  if (*micros > last.count() || *micros < first.count()) return std::nullopt;
  return std::chrono::time_point_cast<Duration>(kPostgresEpoch + microseconds(*micros));
}

}  // namespace idemgate::storage::pg::binary
