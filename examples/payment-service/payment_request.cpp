#include "examples/payment-service/payment_request.hpp"

#include <boost/json/basic_parser_impl.hpp>
#include <charconv>
#include <map>

namespace idemgate::examples::payment {
namespace {

namespace json = boost::json;

enum class Kind { string, number, boolean, null, object, array };

struct Member {
  Kind kind = Kind::null;
  std::string text;  // string contents, or the literal text of a number
};

// Collects the members of the top-level object with the literal text of numbers; the DOM
// parser would turn 10.1234 into a double before we could see its digits.
struct TopLevelHandler {
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  std::map<std::string, Member, std::less<>> members;
  std::string duplicate;  // first member name seen twice
  bool root_is_object = false;
  int depth = 0;
  std::string key;
  std::string text;

  void value(Kind kind) {
    if (depth != 1) return;
    if (!members.try_emplace(key, Member{kind, std::move(text)}).second && duplicate.empty())
      duplicate = key;
    text.clear();
  }
  void begin_container(Kind kind) {
    if (depth == 0) root_is_object = kind == Kind::object;
    if (depth == 1) value(kind);
    ++depth;
  }

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_array_begin(json::error_code&) { return begin_container(Kind::array), true; }
  bool on_array_end(std::size_t, json::error_code&) { return --depth, true; }
  bool on_object_begin(json::error_code&) { return begin_container(Kind::object), true; }
  bool on_object_end(std::size_t, json::error_code&) { return --depth, true; }
  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    if (depth == 1) text.append(s.data(), s.size());
    return true;
  }
  bool on_string(json::string_view s, std::size_t n, json::error_code& ec) {
    on_string_part(s, n, ec);
    value(Kind::string);
    return true;
  }
  // A key may arrive in parts (on_key_part…, then on_key with the rest).
  bool key_in_progress = false;
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    if (depth != 1) return true;
    if (!key_in_progress) key.clear();
    key_in_progress = true;
    key.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t n, json::error_code& ec) {
    on_key_part(s, n, ec);
    key_in_progress = false;
    return true;
  }
  bool on_number_part(json::string_view s, json::error_code&) {
    if (depth == 1) text.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t, json::string_view s, json::error_code& ec) {
    on_number_part(s, ec);
    value(Kind::number);
    return true;
  }
  bool on_uint64(std::uint64_t, json::string_view s, json::error_code& ec) {
    return on_int64(0, s, ec);
  }
  bool on_double(double, json::string_view s, json::error_code& ec) { return on_int64(0, s, ec); }
  bool on_bool(bool, json::error_code&) { return value(Kind::boolean), true; }
  bool on_null(json::error_code&) { return value(Kind::null), true; }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }
};

using Members = std::map<std::string, Member, std::less<>>;

std::variant<Members, FieldError> parse_object(std::string_view body) {
  json::basic_parser<TopLevelHandler> parser{json::parse_options{}};
  json::error_code ec;
  const std::size_t used = parser.write_some(false, body.data(), body.size(), ec);
  if (!ec && used != body.size()) ec = json::error::extra_data;
  if (ec) return FieldError{"", "The body is not valid JSON: " + ec.message() + "."};
  TopLevelHandler& h = parser.handler();
  if (!h.root_is_object) return FieldError{"", "The body must be a JSON object."};
  if (!h.duplicate.empty())
    return FieldError{h.duplicate, "The member '" + h.duplicate + "' appears more than once."};
  return std::move(h.members);
}

std::size_t code_points(std::string_view utf8) {
  std::size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

// Writes the string member `name` into `out`; an absent member is an error unless `fallback`
// is given.
std::optional<FieldError> take_id(const Members& members, const std::string& name, std::string& out,
                                  const char* fallback = nullptr) {
  auto it = members.find(name);
  if (it == members.end()) {
    if (fallback) {
      out = fallback;
      return std::nullopt;
    }
    return FieldError{name, "The member '" + name + "' is required."};
  }
  const Member& m = it->second;
  if (m.kind != Kind::string) return FieldError{name, "'" + name + "' must be a JSON string."};
  if (m.text.empty()) return FieldError{name, "'" + name + "' must not be empty."};
  if (code_points(m.text) > kMaxIdLength)
    return FieldError{name, "'" + name + "' must be at most " + std::to_string(kMaxIdLength) +
                                " characters long."};
  if (m.text.find('\0') != std::string::npos)
    return FieldError{name, "'" + name + "' must not contain the NUL character."};
  out = m.text;
  return std::nullopt;
}

}  // namespace

bool is_valid_amount(std::string_view text) {
  const auto dot = text.find('.');
  const std::string_view whole = text.substr(0, dot);
  const std::string_view fraction =
      dot == std::string_view::npos ? std::string_view{} : text.substr(dot + 1);
  auto digits = [](std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (!digits(whole) || whole.size() > 15 || (whole.size() > 1 && whole[0] == '0')) return false;
  if (dot != std::string_view::npos && (!digits(fraction) || fraction.size() > 4)) return false;
  return text.find_first_not_of("0.") != std::string_view::npos;
}

std::optional<long long> parse_id(std::string_view text) {
  long long id = 0;
  if (text.empty() || text[0] == '0') return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc{} || end != text.data() + text.size() || id <= 0) return std::nullopt;
  return id;
}

std::variant<PaymentRequest, FieldError> parse_payment_request(std::string_view body) {
  auto parsed = parse_object(body);
  if (auto* error = std::get_if<FieldError>(&parsed)) return std::move(*error);
  const Members& members = std::get<Members>(parsed);

  PaymentRequest req;
  for (auto [name, out] :
       {std::pair{"order_id", &req.order_id}, std::pair{"customer_id", &req.customer_id},
        std::pair{"provider", &req.provider},
        std::pair{"external_payment_id", &req.external_payment_id}}) {
    if (auto error = take_id(members, name, *out)) return std::move(*error);
  }

  auto it = members.find("amount");
  if (it == members.end()) return FieldError{"amount", "The member 'amount' is required."};
  const Member& amount = it->second;
  if (amount.kind != Kind::string && amount.kind != Kind::number)
    return FieldError{"amount", "'amount' must be a JSON string or number."};
  if (!is_valid_amount(amount.text))
    return FieldError{"amount",
                      "'amount' must be a positive decimal with at most 15 integer and 4 "
                      "fractional digits, without sign or exponent (got '" +
                          amount.text.substr(0, 64) + "')."};
  req.amount = amount.text;
  return req;
}

std::variant<EventRequest, FieldError> parse_event_request(std::string_view body) {
  auto parsed = parse_object(body);
  if (auto* error = std::get_if<FieldError>(&parsed)) return std::move(*error);
  const Members& members = std::get<Members>(parsed);

  EventRequest req;
  if (auto error = take_id(members, "event_id", req.event_id)) return std::move(*error);
  if (auto error = take_id(members, "topic", req.topic, "http")) return std::move(*error);
  if (auto error = take_id(members, "consumer_name", req.consumer_name, "payment-service"))
    return std::move(*error);
  return req;
}

}  // namespace idemgate::examples::payment
