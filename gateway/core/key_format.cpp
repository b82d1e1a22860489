#include "gateway/core/key_format.hpp"

#include <boost/regex.hpp>
#include <stdexcept>

namespace idemgate::core {

struct KeyFormat::Compiled {
  boost::regex regex;
};

namespace {

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// RFC 9562 §4: 8-4-4-4-12 hex digits; the version and variant nibbles are not checked, so
// every generator's output (v1, v4, v7, nil) passes.
bool is_uuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !is_hex(s[i])) return false;
  }
  return true;
}

}  // namespace

KeyFormat KeyFormat::uuid() {
  KeyFormat f;
  f.kind_ = Kind::uuid;
  return f;
}

KeyFormat KeyFormat::pattern(std::string regex) {
  KeyFormat f;
  f.kind_ = Kind::pattern;
  try {
    f.compiled_ =
        std::make_shared<const Compiled>(Compiled{boost::regex(regex, boost::regex::perl)});
  } catch (const boost::regex_error& e) {
    throw std::invalid_argument(std::string("not a valid regular expression: ") + e.what());
  }
  f.pattern_ = std::move(regex);
  return f;
}

std::optional<std::string> KeyFormat::check(std::string_view key) const {
  switch (kind_) {
    case Kind::any:
      return std::nullopt;
    case Kind::uuid:
      if (is_uuid(key)) return std::nullopt;
      return "the key must be a UUID: 32 hexadecimal digits in groups 8-4-4-4-12, e.g. "
             "0f8fad5b-d9cb-469f-a165-70867728950e";
    case Kind::pattern: {
      bool matched = false;
      try {
        matched = boost::regex_match(key.begin(), key.end(), compiled_->regex);
      } catch (const std::runtime_error&) {
        matched = false;  // the complexity bound: a key this costly to match is refused
      }
      if (matched) return std::nullopt;
      return "the key must match the pattern " + pattern_ + " (the whole key)";
    }
  }
  return std::nullopt;
}

}  // namespace idemgate::core
