#include "gateway/core/idempotency_key.hpp"

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/error.hpp>
#include <boost/json/parse_options.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <system_error>

namespace idemgate::core {
namespace {

constexpr std::size_t kMaxJsonDepth = 512;

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
    // SPEC C13: a bare key is visible ASCII without `"`; `;` is an ordinary character there
    // (`a;b` is the key "a;b"), while `,` would make the field a list.
    if (c == '"' || c == ',') {
      return KeyParse::invalid(std::string(field) + " contains '" + std::string(1, ch) +
                               "'; a key must be one string, not a list");
    }
  }
  return check_length(field, std::string(v));
}

// RFC 6901 §3/§4: "" is the whole document; otherwise "/"-separated reference tokens in which
// "~1" stands for "/" and "~0" for "~". nullopt: not a pointer.
std::optional<std::vector<std::string>> pointer_tokens(std::string_view pointer) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;
  if (pointer.front() != '/') return std::nullopt;
  for (std::size_t i = 0; i < pointer.size(); ++i) {
    const char c = pointer[i];
    if (c == '/') {
      tokens.emplace_back();
    } else if (c == '~') {
      if (i + 1 == pointer.size()) return std::nullopt;
      const char next = pointer[++i];
      if (next == '0') {
        tokens.back() += '~';
      } else if (next == '1') {
        tokens.back() += '/';
      } else {
        return std::nullopt;
      }
    } else {
      tokens.back() += c;
    }
  }
  return tokens;
}

// Characters of a UTF-8 string (the parser has validated it): bytes that do not continue one.
std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// A Boost.JSON SAX handler that follows a pointer's reference tokens through one pass over the
// body: it records the value they reach and stops at a member name that occurs twice in an
// object on that path. boost::json::parse would silently keep one of two equal names, so the
// gateway and the upstream could read different event ids from the same body (SPEC C37).
// Only objects on the path are checked: a repeated name elsewhere is the upstream's business.
//
// Containers on the path get a Frame; everything below a container off the path (or below the
// target) is skipped by counting nesting in off_path_.
class PointerHandler {
 public:
  using error_code = boost::system::error_code;

  static constexpr std::size_t max_object_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_array_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_key_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_string_size = std::numeric_limits<std::size_t>::max();

  enum class Found { none, string, integer, other };

  explicit PointerHandler(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  Found found() const { return found_; }
  /// The string's content (Found::string) or the integer's decimal text (Found::integer).
  const std::string& value() const { return value_; }
  /// The repeated member name, when one stopped the parse.
  const std::optional<std::string>& duplicate() const { return duplicate_; }

  bool on_document_begin(error_code&) { return true; }
  bool on_document_end(error_code&) { return true; }
  bool on_array_begin(error_code&) { return begin_container(false); }
  bool on_array_end(std::size_t, error_code&) { return end_container(); }
  bool on_object_begin(error_code&) { return begin_container(true); }
  bool on_object_end(std::size_t, error_code&) { return end_container(); }

  bool on_string_part(boost::json::string_view s, std::size_t, error_code&) {
    if (!in_scalar_) {
      in_scalar_ = true;
      scalar_is_target_ = is_target(enter_value());
    }
    if (scalar_is_target_) value_.append(s.data(), s.size());
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t n, error_code& ec) {
    on_string_part(s, n, ec);
    in_scalar_ = false;
    if (scalar_is_target_) found_ = Found::string;
    return true;
  }

  bool on_key_part(boost::json::string_view s, std::size_t, error_code&) {
    if (off_path_ == 0) key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t n, error_code& ec) {
    if (off_path_ > 0) return true;
    on_key_part(s, n, ec);
    Frame& f = frames_.back();
    const bool on_path = key_ == tokens_[f.depth];
    key_.clear();
    if (!on_path) return true;
    if (f.token_seen) {
      duplicate_ = tokens_[f.depth];
      ec = make_error_code(std::errc::invalid_argument);
      return false;
    }
    f.token_seen = true;
    f.next_on_path = true;
    return true;
  }

  bool on_number_part(boost::json::string_view, error_code&) {
    if (!in_scalar_) {
      in_scalar_ = true;
      scalar_is_target_ = is_target(enter_value());
    }
    return true;
  }
  bool on_int64(std::int64_t i, boost::json::string_view, error_code&) {
    if (end_number()) {
      found_ = Found::integer;
      value_ = std::to_string(i);
    }
    return true;
  }
  bool on_uint64(std::uint64_t u, boost::json::string_view, error_code&) {
    if (end_number()) {
      found_ = Found::integer;
      value_ = std::to_string(u);
    }
    return true;
  }
  bool on_double(double, boost::json::string_view, error_code&) {
    if (end_number()) found_ = Found::other;
    return true;
  }
  bool on_bool(bool, error_code&) {
    if (is_target(enter_value())) found_ = Found::other;
    return true;
  }
  bool on_null(error_code&) {
    if (is_target(enter_value())) found_ = Found::other;
    return true;
  }
  bool on_comment_part(boost::json::string_view, error_code&) { return true; }
  bool on_comment(boost::json::string_view, error_code&) { return true; }

 private:
  struct Frame {
    bool object = false;
    std::size_t depth = 0;      // tokens_[depth] selects this container's child on the path
    std::size_t index = 0;      // arrays: the index of the next element
    bool token_seen = false;    // objects: tokens_[depth] has been a member name
    bool next_on_path = false;  // objects: the value after the current name is on the path
  };

  // Called once at the start of every value: the value's depth on the path (how many tokens
  // reach it), or nullopt when it is off the path.
  std::optional<std::size_t> enter_value() {
    if (off_path_ > 0) return std::nullopt;
    if (frames_.empty()) return std::size_t{0};
    Frame& f = frames_.back();
    bool on_path = false;
    if (f.object) {
      on_path = f.next_on_path;
      f.next_on_path = false;
    } else {
      // RFC 6901 §4: an array index is "0" or digits without a leading zero; "-" and
      // anything else match no element.
      on_path = std::to_string(f.index++) == tokens_[f.depth];
    }
    if (!on_path) return std::nullopt;
    return f.depth + 1;
  }

  bool is_target(std::optional<std::size_t> depth) const {
    return depth && *depth == tokens_.size();
  }

  bool begin_container(bool object) {
    const std::optional<std::size_t> depth = enter_value();
    if (depth && *depth < tokens_.size()) {
      frames_.push_back(Frame{object, *depth});
      return true;
    }
    if (is_target(depth)) found_ = Found::other;
    ++off_path_;
    return true;
  }

  bool end_container() {
    if (off_path_ > 0) {
      --off_path_;
    } else {
      frames_.pop_back();
    }
    return true;
  }

  bool end_number() {
    if (!in_scalar_) scalar_is_target_ = is_target(enter_value());
    in_scalar_ = false;
    return scalar_is_target_;
  }

  std::vector<std::string> tokens_;
  std::vector<Frame> frames_;
  std::size_t off_path_ = 0;
  std::string key_;
  bool in_scalar_ = false;
  bool scalar_is_target_ = false;
  Found found_ = Found::none;
  std::string value_;
  std::optional<std::string> duplicate_;
};

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
  const std::string where(pointer);
  std::optional<std::vector<std::string>> tokens = pointer_tokens(pointer);
  if (!tokens) {
    return KeyParse::invalid("the key source " + where + " is not an RFC 6901 JSON Pointer");
  }
  if (body.empty()) {
    return KeyParse::invalid("the body must be JSON to read the key at " + where +
                             ", and it is empty");
  }
  // Boost.JSON's default nesting limit (32) would turn a deep but valid event into a 400; the
  // handler keeps no state per level off the path, and the body is bounded by max_request_body.
  boost::json::parse_options options;
  options.max_depth = kMaxJsonDepth;
  boost::json::basic_parser<PointerHandler> parser(options, std::move(*tokens));
  boost::system::error_code ec;
  const std::size_t used = parser.write_some(false, body.data(), body.size(), ec);
  const PointerHandler& h = parser.handler();
  if (h.duplicate()) {
    return KeyParse::invalid("the body has the member \"" + *h.duplicate() +
                             "\" twice on the path " + where + "; the key must be unambiguous");
  }
  if (!ec && used < body.size()) ec = boost::json::error::extra_data;
  if (ec) {
    return KeyParse::invalid("the body must be JSON to read the key at " + where + ": " +
                             ec.message());
  }
  switch (h.found()) {
    case PointerHandler::Found::none:
      return KeyParse::absent();
    case PointerHandler::Found::string: {
      const std::size_t length = utf8_length(h.value());
      if (length == 0 || length > kMaxKeyLength) {
        return KeyParse::invalid("the key at " + where +
                                 " must be a string of 1 to 255 characters, got " +
                                 std::to_string(length));
      }
      return KeyParse::valid("s:" + h.value());
    }
    case PointerHandler::Found::integer:
      return KeyParse::valid("i:" + h.value());
    case PointerHandler::Found::other:
      break;
  }
  return KeyParse::invalid("the key at " + where + " must be a string or an integer");
}

KeyParse read_key(const KeySpec& spec, const FieldLookup& lookup, std::string_view body) {
  KeyParse key;
  switch (spec.kind) {
    case KeySpec::Kind::header: {
      const std::string* named_by = nullptr;
      for (const auto& name : spec.fields) {
        const auto values = lookup(name);
        KeyParse part = parse_key_field(name, values);
        if (part.status == KeyParse::Status::invalid) return part;
        if (part.status == KeyParse::Status::absent) continue;
        if (named_by == nullptr) {
          named_by = &name;
          key = std::move(part);
        } else if (part.key != key.key) {
          return KeyParse::invalid("the request has both " + *named_by + " and " + name +
                                   " with different values; send the key in one of them, or the "
                                   "same key in both");
        }
      }
      break;
    }
    case KeySpec::Kind::headers: {
      std::vector<KeyParse> parts;
      parts.reserve(spec.fields.size());
      for (const auto& name : spec.fields) parts.push_back(parse_key_field(name, lookup(name)));
      return join_key_parts(spec.fields, parts);
    }
    case KeySpec::Kind::json_pointer:
      key = parse_json_pointer_key(body, spec.json_pointer);
      break;
  }
  if (key.status != KeyParse::Status::valid) return key;
  // A JSON key carries its type as a two-character prefix ("s:", "i:"); the format is about the
  // value the client wrote.
  const std::string_view text = spec.kind == KeySpec::Kind::json_pointer
                                    ? std::string_view(key.key).substr(2)
                                    : std::string_view(key.key);
  if (auto problem = spec.format.check(text)) return KeyParse::invalid(std::move(*problem));
  return key;
}

}  // namespace idemgate::core
