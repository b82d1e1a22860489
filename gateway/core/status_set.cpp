#include "gateway/core/status_set.hpp"

#include <cstddef>
#include <string>

#include "gateway/common/ows.hpp"

namespace idemgate::core {

namespace {

constexpr unsigned kMinStatus = 100;
constexpr unsigned kMaxStatus = 599;

// Reads a three-digit status code; anything else is rejected so that "2xx" or "+200" never
// silently become a different set.
bool parse_code(std::string_view s, unsigned& out, std::string& error) {
  s = common::trim_ows(s);
  if (s.empty()) {
    error = "expected a status code or a range like 200-299";
    return false;
  }
  unsigned v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') {
      error = "'" + std::string(s) + "' is not a status code (expected 100-599)";
      return false;
    }
    if (v > kMaxStatus) break;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (s.size() != 3 || v < kMinStatus || v > kMaxStatus) {
    error = "status code " + std::string(s) + " is outside 100-599";
    return false;
  }
  out = v;
  return true;
}

}  // namespace

StatusSet StatusSet::default_storable() {
  // 2xx-4xx except the transient or pre-execution refusals 401, 403, 407, 408, 425, 429 (SPEC C21).
  // Built once: every RoutePolicy starts from this set, one per keyed request.
  static const StatusSet kDefault = [] {
    StatusSet set;
    for (unsigned s = 200; s <= 499; ++s) {
      if (s == 401 || s == 403 || s == 407 || s == 408 || s == 425 || s == 429) continue;
      set.insert(s);
    }
    return set;
  }();
  return kDefault;
}

std::optional<StatusSet> StatusSet::parse(std::string_view text, std::string& error) {
  StatusSet set;
  if (common::trim_ows(text).empty()) {
    error = "the list is empty; expected codes and ranges like \"200-299,404\"";
    return std::nullopt;
  }
  while (true) {
    const std::size_t comma = text.find(',');
    const std::string_view item = common::trim_ows(text.substr(0, comma));
    const std::size_t dash = item.find('-');
    unsigned lo = 0;
    unsigned hi = 0;
    if (dash == std::string_view::npos) {
      if (!parse_code(item, lo, error)) return std::nullopt;
      hi = lo;
    } else {
      if (!parse_code(item.substr(0, dash), lo, error) ||
          !parse_code(item.substr(dash + 1), hi, error)) {
        return std::nullopt;
      }
      if (hi < lo) {
        error = "range " + std::string(item) + " is reversed";
        return std::nullopt;
      }
    }
    for (unsigned s = lo; s <= hi; ++s) set.insert(s);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return set;
}

}  // namespace idemgate::core
