#pragma once
// Request identity for the Idempotency-Key contract (SPEC §4): the scope that namespaces keys,
// the record id derived from scope and key, and the request fingerprint.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/core/hash.hpp"

namespace idemgate::core {

/// Values of one configured header as received (all occurrences in order; empty if absent).
struct HeaderValues {
  std::string_view name;
  std::vector<std::string_view> values;
};

/// scope = SHA-256 over the route name and the values of `key_scope.headers` in config order
/// (SPEC §4, C20). An absent header and an empty one hash differently.
Sha256 compute_scope(std::string_view route_name, std::span<const HeaderValues> scope_headers);

/// The record's primary key: SHA-256 over scope and key. Store keys (Redis and Postgres) are
/// built from this, never from raw client input (SPEC C23).
Sha256 record_id(const Sha256& scope, std::string_view key);

/// The key header value the upstream gets with `upstream_key: rewrite` (SPEC C14): lower-case
/// hex of HMAC-SHA-256 under `secret` of the SHA-256 over the scope's lower-case hex and the key
/// (each a length-framed field, as in Sha256Builder::field). Equal keys of two scopes differ.
std::string upstream_key_rewrite(std::string_view secret, const Sha256& scope,
                                 std::string_view key);

/// How the body enters the fingerprint (`fingerprint_body`, SPEC C35).
enum class BodyMode { bytes, json };

/// fingerprint = SHA-256 over method, request target (path + query as received), the
/// `fingerprint.headers` values in config order, and the body bytes after transfer decoding
/// (SPEC §4, C27). In BodyMode::json a body that parses as JSON is replaced by its canonical
/// form (object members sorted by name, no insignificant white space); a body that is not
/// JSON falls back to its bytes (C35).
Sha256 compute_fingerprint(std::string_view method, std::string_view target,
                           std::span<const HeaderValues> headers, std::string_view body,
                           BodyMode mode);

/// The canonical JSON text of `body` (sorted member names, no white space, strings re-escaped,
/// numbers exactly as received), or std::nullopt when `body` is not JSON. A fixed point:
/// canonical_json(*canonical_json(b)) == canonical_json(b).
std::optional<std::string> canonical_json(std::string_view body);

}  // namespace idemgate::core
