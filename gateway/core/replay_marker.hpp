#pragma once
// The `committed` marker that replaces an in-flight lock once its record is committed (SPEC C23):
// the value of the lock key in the lock store from then on, so that a retry learns from one lock
// store round trip that the key is done, and for small responses gets the replay itself.

#include <optional>
#include <string>
#include <string_view>

#include "gateway/core/hash.hpp"
#include "gateway/core/stored_response.hpp"

namespace idemgate::core {

/// What a marker says of a committed record: its request fingerprint and, when it fitted
/// `replay_cache_max_bytes`, the stored response (status, end-to-end headers in order, body,
/// body_omitted), byte for byte the one in Postgres (C16).
struct ReplayMarker {
  Sha256 fingerprint{};
  std::optional<StoredResponse> response;  ///< absent: look the record up in Postgres
};

/// Whether a lock key's value is a marker rather than an owner token. Owner tokens are 32 hex
/// characters (random_token); markers start with a magic that is not hex.
bool is_replay_marker(std::string_view value) noexcept;

/// The lock key value for `marker`: magic "IGM1", 32 fingerprint bytes, a flags byte, then (when
/// the response is carried) status u16, header count u32, each name and value as u32 length +
/// bytes, body as u32 length + bytes; integers big-endian.
std::string encode_replay_marker(const ReplayMarker& marker);
/// The same encoding from its parts, without copying the response; `response` may be null.
std::string encode_replay_marker(const Sha256& fingerprint, const StoredResponse* response);

/// Decodes a value written by encode_replay_marker. std::nullopt: not a marker, or a marker that
/// is truncated, malformed or not in its one encoding (a status outside 100–599 included); the
/// caller then treats it as carrying no response.
std::optional<ReplayMarker> decode_replay_marker(std::string_view value);

/// Bytes of `response` counted against `replay_cache_max_bytes`: header names and values plus
/// the body.
std::size_t replay_size(const StoredResponse& response) noexcept;

}  // namespace idemgate::core
