#pragma once

#include <bitset>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::core {

/// A set of HTTP status codes 100–599, as written in `store_statuses` (SPEC §2, C21):
/// comma-separated codes and inclusive ranges, e.g. "200-400,402,404-406".
class StatusSet {
 public:
  /// The SPEC default: 2xx–4xx except 401, 403, 407, 408, 425, 429.
  static StatusSet default_storable();

  /// Parses the list form. Returns std::nullopt and fills `error` (one sentence) when a code is
  /// outside 100–599, a range is reversed, or the text is not codes and ranges.
  static std::optional<StatusSet> parse(std::string_view text, std::string& error);

  bool contains(unsigned status) const { return status < 600 && bits_.test(status); }
  void insert(unsigned status) { bits_.set(status); }

 private:
  std::bitset<600> bits_;
};

}  // namespace idemgate::core
