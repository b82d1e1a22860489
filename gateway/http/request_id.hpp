#pragma once
// Request ids: the field (X-Request-Id by default, `request_id:` in the configuration) that names
// one request in the client's, the gateway's and the upstream's logs. A valid received id is
// kept, as Envoy keeps `x-request-id` behind an edge; a missing or unreasonable one is replaced
// by a generated UUID v4, as nginx's `$request_id` is generated (conf/REFERENCE.md,
// "request_id").

#include <boost/beast/http/fields.hpp>
#include <cstddef>
#include <string>
#include <string_view>

#include "gateway/http/headers.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

/// The longest received id that is kept, in bytes.
inline constexpr std::size_t kMaxRequestIdBytes = 200;

/// The length of a generated id: a UUID in its 8-4-4-4-12 text form.
inline constexpr std::size_t kGeneratedRequestIdBytes = 36;

/// Whether `value` is an id the gateway keeps: 1 to kMaxRequestIdBytes bytes, each visible ASCII
/// (0x21–0x7E: no space, control or non-ASCII byte). Pure.
bool valid_request_id(std::string_view value);

/// Writes a new random UUID v4 (RFC 9562 §5.4) in lower-case 8-4-4-4-12 form to `out`. The 122
/// random bits come from OpenSSL's CSPRNG (common::random_bytes, as lock owner tokens do).
/// Throws std::runtime_error when the generator fails. Safe from any thread.
void generate_request_id(char (&out)[kGeneratedRequestIdBytes]);

/// Decides the id of a request whose header is `fields`, per `config`, and makes the request
/// field agree with it:
/// - exactly one field named `config.header` with a valid value (valid_request_id): that value,
///   the field untouched;
/// - otherwise, with `config.generate`: a generated id, which replaces every such field (the
///   client's value is dropped) or is added;
/// - otherwise (`generate: false`): "" and the fields untouched (forwarded as received).
/// The id is copied into `storage` (its capacity is reused from request to request) and the
/// returned view points into it. Returns "" when the request has no id.
std::string_view apply_request_id(boost::beast::http::fields& fields, const RequestId& config,
                                  std::string& storage);
/// The same, with a generated id's field added to `added` instead of `fields` (any such field
/// of the request is still removed from `fields`).
std::string_view apply_request_id(boost::beast::http::fields& fields, const RequestId& config,
                                  std::string& storage, AddedFields& added);

}  // namespace idemgate::http
