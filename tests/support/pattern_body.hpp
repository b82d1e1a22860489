#pragma once
// The pattern body of the streaming tests (SPEC C38): byte i of a body is i % 251, so any piece
// of a transfer can be checked without keeping the rest. stream-upstream writes and checks it,
// the streaming tests check and write it; both fill and compare at memcpy/memcmp speed (the
// sanitizer build has no optimiser).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace idemgate::test {

inline constexpr unsigned kPatternModulus = 251;
/// The longest run fill_pattern and pattern_matches copy or compare at once.
inline constexpr std::size_t kPatternRun = 64 * 1024;

/// Bytes [offset % 251, offset % 251 + n) of this table are the pattern bytes [offset, offset + n)
/// for n ≤ kPatternRun.
inline const std::vector<char>& pattern_table() {
  static const std::vector<char> table = [] {
    std::vector<char> t(kPatternRun + kPatternModulus);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<char>(i % kPatternModulus);
    return t;
  }();
  return table;
}

/// Writes the pattern bytes [offset, offset + n) to `out`.
inline void fill_pattern(char* out, std::size_t n, std::uint64_t offset) {
  while (n > 0) {
    const std::size_t len = std::min(n, kPatternRun);
    std::memcpy(out, pattern_table().data() + offset % kPatternModulus, len);
    out += len;
    offset += len;
    n -= len;
  }
}

/// Whether `data` holds the pattern bytes [offset, offset + n).
inline bool pattern_matches(const char* data, std::size_t n, std::uint64_t offset) {
  while (n > 0) {
    const std::size_t len = std::min(n, kPatternRun);
    if (std::memcmp(data, pattern_table().data() + offset % kPatternModulus, len) != 0) {
      return false;
    }
    data += len;
    offset += len;
    n -= len;
  }
  return true;
}

}  // namespace idemgate::test
