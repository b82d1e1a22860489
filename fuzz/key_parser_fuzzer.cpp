// Fuzz target for the key parsers of SPEC C13, C28 and C37. The first byte picks the parser
// (modulo 3); the rest is its input:
//   0: parse_key_field — the values of the field, one per line ('\n'-separated);
//   1: join_key_parts — one header value per line, each parsed by parse_key_field, then joined;
//   2: parse_json_pointer_key — the pointer on the first line, the JSON body after it.
// Hand-written seeds start with the digits '0', '1' or '2'.

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/check.hpp"
#include "gateway/core/idempotency_key.hpp"

namespace core = idemgate::core;
using idemgate::fuzz::check;
using Status = core::KeyParse::Status;

namespace {

/// The sf-string form of `key` (RFC 8941 §3.3.3): quoted, with `"` and `\` escaped.
std::string quoted(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

void check_parse_result(const core::KeyParse& p) {
  if (p.status == Status::valid) {
    check(!p.key.empty() && p.key.size() <= core::kMaxKeyLength, "valid key of 1-255 characters");
    for (unsigned char c : p.key) check(c >= 0x20 && c < 0x7f, "valid key of printable ASCII");
  } else if (p.status == Status::invalid) {
    check(!p.detail.empty(), "an invalid key carries a detail");
  }
}

void fuzz_key_field(std::string_view input) {
  std::vector<std::string_view> values;
  idemgate::fuzz::split(input, '\n', values);
  const core::KeyParse p = core::parse_key_field("Idempotency-Key", values);
  check_parse_result(p);
  if (values.size() > 1) check(p.status == Status::invalid, "two fields are invalid (C13)");
  // C13: one bare field of 1-255 visible ASCII characters without `"` or `,` is that key (`;`
  // included).
  if (values.size() == 1 && !values[0].empty() && values[0].size() <= 255 &&
      std::all_of(values[0].begin(), values[0].end(), [](char ch) {
        const auto c = static_cast<unsigned char>(ch);
        return c > 0x20 && c < 0x7f && c != '"' && c != ',';
      })) {
    check(p.status == Status::valid && p.key == values[0], "a bare visible-ASCII token is a key");
  }
  if (p.status != Status::valid) return;
  // C28: the sf-string form of a key is the same key.
  const std::string again = quoted(p.key);
  const std::string_view one[] = {again};
  const core::KeyParse q = core::parse_key_field("Idempotency-Key", one);
  check(q.status == Status::valid && q.key == p.key, "a key and its quoted form are one key");
}

void fuzz_join(std::string_view input) {
  std::vector<std::string_view> values;
  idemgate::fuzz::split(input, '\n', values);
  std::vector<std::string> names;
  std::vector<core::KeyParse> parts;
  for (std::size_t i = 0; i < values.size(); ++i) {
    names.push_back("X-Part-" + std::to_string(i));
    // An empty line stands for an absent header.
    std::span<const std::string_view> v =
        values[i].empty() ? std::span<const std::string_view>() : std::span(&values[i], 1);
    parts.push_back(core::parse_key_field(names.back(), v));
  }
  const core::KeyParse p = core::join_key_parts(names, parts);
  if (p.status == Status::valid) {
    check(!p.key.empty(), "a joined key is not empty");
    for (const auto& part : parts) check(part.status == Status::valid, "every part valid");
  }
  if (p.status == Status::invalid) check(!p.detail.empty(), "an invalid key carries a detail");
}

void fuzz_json_pointer(std::string_view input) {
  const auto eol = input.find('\n');
  const std::string_view pointer = input.substr(0, eol);
  const std::string_view body = eol == std::string_view::npos ? "" : input.substr(eol + 1);
  const core::KeyParse p = core::parse_json_pointer_key(body, pointer);
  if (p.status == Status::invalid) check(!p.detail.empty(), "an invalid key carries a detail");
  if (p.status != Status::valid) return;
  const bool is_string = p.key.starts_with("s:");
  check(is_string || p.key.starts_with("i:"), "a JSON key is typed s: or i:");
  // The parser claims strict RFC 8259: a body it takes a key from must be JSON to Boost.JSON too.
  boost::json::parse_options opts;
  opts.max_depth = 1024;
  boost::system::error_code ec;
  const boost::json::value doc = boost::json::parse(body, ec, {}, opts);
  check(!ec, "a body that yields a key is strict JSON");
  if (!is_string) return;
  const boost::json::value* found = doc.find_pointer(pointer, ec);
  // Boost.JSON keeps the last of repeated names; the key parser rejects repeats on the path.
  if (found == nullptr) return;
  check(found->is_string() && std::string_view(found->get_string()) == p.key.substr(2),
        "a string key is the value at the pointer");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_key_field(input);
      break;
    case 1:
      fuzz_join(input);
      break;
    default:
      fuzz_json_pointer(input);
      break;
  }
  return 0;
}
