#pragma once
// Values of Postgres's binary wire format (big-endian, fixed sizes), decoded without libpq, so
// that PgResult and the pure row decoders (pg_record_codec.hpp) share one definition; and the
// array parameters the batched statements send (PgBatchWriter, PgBatchReader).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

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

// Element type OIDs (pg_type.dat), checked by the server's array_recv.
inline constexpr std::uint32_t kBoolOid = 16;
inline constexpr std::uint32_t kByteaOid = 17;
inline constexpr std::uint32_t kInt8Oid = 20;
inline constexpr std::uint32_t kInt4Oid = 23;
inline constexpr std::uint32_t kTextOid = 25;

/// Appends the low `bytes` bytes of `value` to `out`, big-endian.
inline void put_big_endian(std::string& out, std::uint64_t value, int bytes) {
  for (int shift = (bytes - 1) * 8; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

/// A one-dimensional array without NULLs in the binary wire format (array_send): dimensions,
/// flags, element type, then per dimension its length and lower bound, then each element with
/// its length. `count` elements must be appended with element() or element_be().
class Array {
 public:
  Array(std::uint32_t element_oid, std::size_t count, std::size_t reserve) {
    out_.reserve(20 + reserve + 4 * count);
    put_big_endian(out_, 1, 4);  // dimensions
    put_big_endian(out_, 0, 4);  // no NULLs
    put_big_endian(out_, element_oid, 4);
    put_big_endian(out_, count, 4);
    put_big_endian(out_, 1, 4);  // lower bound
  }
  void element(std::string_view bytes) {
    put_big_endian(out_, bytes.size(), 4);
    out_.append(bytes);
  }
  void element_be(std::uint64_t value, int bytes) {
    put_big_endian(out_, static_cast<std::uint64_t>(bytes), 4);
    put_big_endian(out_, value, bytes);
  }
  /// The encoded array, for a binary parameter.
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace idemgate::storage::pg::binary
