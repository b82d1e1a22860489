#pragma once
// The format a route demands of its idempotency keys (SPEC C56): any, a UUID, or a pattern.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::core {

/// `idempotency.key_format`. Immutable once built; copies share the compiled pattern.
/// Thread-safe: check() may be called from any thread at once.
class KeyFormat {
 public:
  enum class Kind { any, uuid, pattern };

  /// Every key that passes C13 (the default).
  KeyFormat() = default;
  static KeyFormat uuid();
  /// A regular expression (Perl syntax, Boost.Regex) that must match the whole key. Throws
  /// std::invalid_argument with one sentence when it does not compile.
  static KeyFormat pattern(std::string regex);

  Kind kind() const noexcept { return kind_; }
  /// The pattern as written (Kind::pattern), else empty.
  const std::string& pattern_text() const noexcept { return pattern_; }

  /// nullopt when `key` (after C13 decoding, at most kMaxKeyLength characters) has the format;
  /// otherwise the `detail` of the 400 `invalid-key` answer, which states the rule. A UUID is
  /// 8-4-4-4-12 hexadecimal digits, either case (RFC 9562 §4), any version. A pattern whose
  /// matching exceeds Boost.Regex's complexity bound counts as not matching: the engine does
  /// not recurse and bounds its backtracking, so a key can neither exhaust the stack nor spin.
  std::optional<std::string> check(std::string_view key) const;

 private:
  struct Compiled;
  Kind kind_ = Kind::any;
  std::string pattern_;
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace idemgate::core
