#pragma once
// Reading an idempotency key out of a request: the Idempotency-Key field (IETF
// draft-ietf-httpapi-idempotency-key-header §2: an RFC 8941 sf-string), another header, several
// headers joined (saga id + step), or a JSON Pointer into the body (SPEC C13, C28, C37).

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/core/key_format.hpp"

namespace idemgate::core {

/// Longest key accepted, in characters after unquoting (SPEC C13).
inline constexpr std::size_t kMaxKeyLength = 255;

/// The outcome of reading a key: absent (no source present), valid, or invalid with a reason.
struct KeyParse {
  enum class Status { absent, valid, invalid };
  Status status = Status::absent;
  std::string key;     ///< the key after unquoting (valid only); compared byte-exactly (C28)
  std::string detail;  ///< one sentence for the 400 problem details (invalid only)

  static KeyParse absent() { return {}; }
  static KeyParse valid(std::string key) { return {Status::valid, std::move(key), {}}; }
  static KeyParse invalid(std::string detail) { return {Status::invalid, {}, std::move(detail)}; }
};

/// Parses every occurrence of a key header field (`values` in arrival order; `field_name` is used
/// in the detail text only). No occurrence → absent. Accepted forms (SPEC C13): an sf-string
/// `"abc"` with `\"` and `\\` escapes, or a bare token of visible ASCII without `"` or `,` (`;` is
/// part of a bare key: `a;b` is the key "a;b");
/// 1–255 characters after unquoting; surrounding spaces/tabs are ignored. Invalid: two fields, an
/// empty value, too long, control or non-ASCII bytes, bad escapes, an unterminated string, or
/// anything after the closing quote (parameters, a list). `"abc"` and `abc` are the same key (C28).
KeyParse parse_key_field(std::string_view field_name, std::span<const std::string_view> values);

/// A composite key from several headers (SPEC C37, e.g. saga id + step): each part parsed by
/// parse_key_field, joined length-prefixed (`<len>:<part>` per part) so that "a|b"+"c" and
/// "a"+"b|c" never collide. All parts absent → absent; some but not all present → invalid.
KeyParse join_key_parts(std::span<const std::string> names, std::span<const KeyParse> parts);

/// A key from a JSON body at RFC 6901 pointer `pointer` (SPEC C37; `~0` is `~`, `~1` is `/`,
/// array elements by decimal index without leading zeros, `-` matches nothing). The value must be
/// a string of 1–255 characters (Unicode characters, taken verbatim after JSON unescaping) or an
/// integer; `42` and `"42"` are different keys (strings are prefixed `s:`, integers `i:`).
/// Invalid (→ 400): a body that is empty or not one strict JSON document (RFC 8259, UTF-8, no
/// comments, nesting ≤ 512), any other value type at the pointer, or a member name repeated in
/// any object on the pointer's path (`{"event_id":1,"event_id":2}`: the gateway and the upstream
/// could pick different ones). A repeated name elsewhere in the body is accepted. The pointer
/// absent from a JSON body (including a path through a scalar) → absent. One pass, no DOM.
KeyParse parse_json_pointer_key(std::string_view body, std::string_view pointer);

/// Where a route's key comes from and what it must look like (SPEC C13, C37, C55, C56): the one
/// description the gateway, `idemgate keys` and the fuzz targets read keys by.
struct KeySpec {
  enum class Kind {
    header,        ///< one key in the first of `fields` present (aliases, C55)
    headers,       ///< one part per field of `fields`, joined (C37, saga id + step)
    json_pointer,  ///< a JSON value in the body at `json_pointer` (C37)
  };
  Kind kind = Kind::header;
  std::vector<std::string> fields = {"Idempotency-Key"};
  std::string json_pointer;
  /// Checked on a key read from `header` fields or a JSON value (its text, without the type
  /// prefix); a composite `headers` key is not checked (the loader allows only `any` there).
  KeyFormat format;
};

/// Every value of the header fields named `name` (case-insensitive), in arrival order.
using FieldLookup = std::function<std::vector<std::string_view>(std::string_view name)>;

/// Reads the key `spec` describes from a request's fields (`lookup`) and body:
/// - header: each field of `fields` is parsed by parse_key_field; none present → absent; any
///   present one invalid → invalid; two present with different keys (compared after C13
///   decoding, so `"abc"` and `abc` agree) → invalid, naming both fields; equal keys are one
///   key (C55).
/// - headers: join_key_parts over `fields`; json_pointer: parse_json_pointer_key.
/// A valid key that fails `spec.format` → invalid with the format's detail (C56).
KeyParse read_key(const KeySpec& spec, const FieldLookup& lookup, std::string_view body);

}  // namespace idemgate::core
