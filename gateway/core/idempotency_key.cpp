#include "gateway/core/idempotency_key.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

namespace idemgate::core {
namespace {

bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

std::string_view trim_ows(std::string_view v) {
  while (!v.empty() && is_ows(v.front())) v.remove_prefix(1);
  while (!v.empty() && is_ows(v.back())) v.remove_suffix(1);
  return v;
}

std::string describe_byte(unsigned char c) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string s = "0x";
  s += kHex[c >> 4];
  s += kHex[c & 0x0f];
  return s;
}

KeyParse check_length(std::string_view field, std::string key) {
  if (key.empty()) return KeyParse::invalid(std::string(field) + " must not be empty");
  if (key.size() > kMaxKeyLength) {
    return KeyParse::invalid(std::string(field) + " is " + std::to_string(key.size()) +
                             " characters long; the limit is 255");
  }
  return KeyParse::valid(std::move(key));
}

// RFC 8941 §3.3.3 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE,
// unescaped = %x20-21 / %x23-5B / %x5D-7E.
KeyParse parse_sf_string(std::string_view field, std::string_view v) {
  std::string key;
  std::size_t i = 1;
  for (; i < v.size(); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c == '"') break;
    if (c == '\\') {
      if (i + 1 == v.size()) break;
      const char next = v[++i];
      if (next != '"' && next != '\\') {
        return KeyParse::invalid(std::string(field) + " has an invalid escape '\\" +
                                 std::string(1, next) + "'; only \\\" and \\\\ are allowed");
      }
      key += next;
      continue;
    }
    if (c < 0x20 || c > 0x7e) {
      return KeyParse::invalid(std::string(field) + " contains the byte " + describe_byte(c) +
                               "; only visible ASCII and spaces are allowed");
    }
    key += static_cast<char>(c);
  }
  if (i >= v.size()) {
    return KeyParse::invalid(std::string(field) + " starts a quoted string that is not closed");
  }
  if (i + 1 != v.size()) {
    return KeyParse::invalid(std::string(field) +
                             " must be a single string: parameters and lists are not allowed");
  }
  return check_length(field, std::move(key));
}

KeyParse parse_bare(std::string_view field, std::string_view v) {
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c > 0x7e) {
      return KeyParse::invalid(std::string(field) + " contains the byte " + describe_byte(c) +
                               "; only visible ASCII is allowed (quote the key to use spaces)");
    }
    if (c == '"' || c == ',' || c == ';') {
      return KeyParse::invalid(std::string(field) + " contains '" + std::string(1, ch) +
                               "'; a key must be one string, not a list or parameters");
    }
  }
  return check_length(field, std::string(v));
}

}  // namespace

KeyParse parse_key_field(std::string_view field_name, std::span<const std::string_view> values) {
  if (values.empty()) return KeyParse::absent();
  if (values.size() > 1) {
    return KeyParse::invalid("the request has " + std::to_string(values.size()) + " " +
                             std::string(field_name) + " fields; send exactly one");
  }
  const std::string_view v = trim_ows(values.front());
  if (v.empty()) return KeyParse::invalid(std::string(field_name) + " must not be empty");
  if (v.front() == '"') return parse_sf_string(field_name, v);
  return parse_bare(field_name, v);
}

KeyParse join_key_parts(std::span<const std::string> names, std::span<const KeyParse> parts) {
  std::size_t present = 0;
  for (const auto& p : parts) {
    if (p.status == KeyParse::Status::invalid) return p;
    if (p.status == KeyParse::Status::valid) ++present;
  }
  if (present == 0) return KeyParse::absent();
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].status != KeyParse::Status::valid) {
      return KeyParse::invalid("the key is made of several fields and " + names[i] + " is missing");
    }
    joined += std::to_string(parts[i].key.size());
    joined += ':';
    joined += parts[i].key;
  }
  return KeyParse::valid(std::move(joined));
}

KeyParse parse_json_pointer_key(std::string_view body, std::string_view pointer) {
  boost::system::error_code ec;
  const boost::json::value doc = boost::json::parse(body, ec);
  if (ec) {
    return KeyParse::invalid("the body must be JSON to read the key at " + std::string(pointer) +
                             ": " + ec.message());
  }
  const boost::json::value* found = doc.find_pointer(pointer, ec);
  if (found == nullptr) return KeyParse::absent();
  if (found->is_string()) {
    const auto& s = found->get_string();
    if (s.empty() || s.size() > kMaxKeyLength) {
      return KeyParse::invalid("the key at " + std::string(pointer) +
                               " must be a string of 1 to 255 characters");
    }
    return KeyParse::valid("s:" + std::string(s));
  }
  if (found->is_int64()) return KeyParse::valid("i:" + std::to_string(found->get_int64()));
  if (found->is_uint64()) return KeyParse::valid("i:" + std::to_string(found->get_uint64()));
  return KeyParse::invalid("the key at " + std::string(pointer) +
                           " must be a string or an integer");
}

}  // namespace idemgate::core
