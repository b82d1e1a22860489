// Fuzz target for the committed marker (gateway/core/replay_marker.hpp, SPEC C16, C23): the value
// a gateway reads back from the lock key in Redis, possibly written by another gateway version
// or damaged. Every value either decodes to a marker whose encoding is the value itself, or is
// refused; and a marker built from the input round-trips through encode and decode.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/check.hpp"
#include "gateway/core/replay_marker.hpp"

namespace core = idemgate::core;
using idemgate::fuzz::check;

namespace {

constexpr char kSeparator = '\x1f';

/// A marker from the input: the first byte picks status and flags, then name/value pairs and a
/// body separated by '\x1f'.
core::ReplayMarker marker_of(std::string_view input) {
  core::ReplayMarker marker;
  for (std::size_t i = 0; i < marker.fingerprint.size() && i < input.size(); ++i) {
    marker.fingerprint[i] = static_cast<std::uint8_t>(input[i]);
  }
  const auto pick = input.empty() ? 0u : static_cast<unsigned char>(input[0]);
  if ((pick & 1u) == 0) return marker;
  std::vector<std::string_view> parts;
  idemgate::fuzz::split(input, kSeparator, parts);
  core::StoredResponse response;
  response.status = static_cast<std::uint16_t>(100 + pick);
  response.body_omitted = (pick & 2u) != 0;
  for (std::size_t i = 0; i + 1 < parts.size(); i += 2) {
    response.headers.emplace_back(std::string(parts[i]), std::string(parts[i + 1]));
  }
  if (!parts.empty()) response.body = std::string(parts.back());
  marker.response = std::move(response);
  return marker;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  const auto decoded = core::decode_replay_marker(input);
  if (decoded) {
    check(core::is_replay_marker(input), "only a value with the magic decodes");
    check(core::encode_replay_marker(*decoded) == input, "a decoded marker re-encodes to itself");
  }

  const core::ReplayMarker built = marker_of(input);
  const std::string value = core::encode_replay_marker(built);
  check(core::is_replay_marker(value), "an encoded marker is a marker");
  const auto back = core::decode_replay_marker(value);
  check(back.has_value(), "an encoded marker decodes");
  check(back->fingerprint == built.fingerprint, "the fingerprint survives");
  check(back->response.has_value() == built.response.has_value(), "the response flag survives");
  if (built.response) {
    check(back->response->status == built.response->status, "the status survives");
    check(back->response->headers == built.response->headers, "the headers survive in order");
    check(back->response->body == built.response->body, "the body survives");
    check(back->response->body_omitted == built.response->body_omitted, "body_omitted survives");
  }
  return 0;
}
