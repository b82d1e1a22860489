#pragma once
// Optional whitespace (RFC 9110 §5.6.3: SP and HTAB) around field values and list members.

#include <string_view>

namespace idemgate::common {

/// `s` without leading and trailing SP and HTAB (RFC 9110 §5.6.3 OWS). Views into `s`.
constexpr std::string_view trim_ows(std::string_view s) {
  const auto ows = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && ows(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace idemgate::common
