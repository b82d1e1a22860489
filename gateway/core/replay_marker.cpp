#include "gateway/core/replay_marker.hpp"

#include <cstdint>
#include <limits>

namespace idemgate::core {
namespace {

constexpr std::string_view kMagic = "IGM1";
constexpr std::uint8_t kHasResponse = 1;
constexpr std::uint8_t kBodyOmitted = 2;

void put_u16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void put_bytes(std::string& out, std::string_view bytes) {
  put_u32(out, static_cast<std::uint32_t>(bytes.size()));
  out.append(bytes);
}

/// A bounds-checked reader: every take fails (and stays failed) past the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return in_.empty(); }

  std::string_view take(std::size_t n) {
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return {};
    }
    auto out = in_.substr(0, n);
    in_.remove_prefix(n);
    return out;
  }
  std::uint32_t u(std::size_t width) {
    std::uint32_t v = 0;
    for (unsigned char c : take(width)) v = (v << 8) | c;
    return v;
  }
  std::string_view bytes() { return take(u(4)); }

 private:
  std::string_view in_;
  bool ok_ = true;
};

}  // namespace

bool is_replay_marker(std::string_view value) noexcept {
  return value.starts_with(kMagic);
}

std::size_t replay_size(const StoredResponse& response) noexcept {
  std::size_t size = response.body.size();
  for (const auto& [name, value] : response.headers) size += name.size() + value.size();
  return size;
}

std::string encode_replay_marker(const ReplayMarker& marker) {
  return encode_replay_marker(marker.fingerprint, marker.response ? &*marker.response : nullptr);
}

std::string encode_replay_marker(const Sha256& fingerprint, const StoredResponse* response) {
  std::string out;
  out.reserve(kMagic.size() + fingerprint.size() + 1 +
              (response ? 10 + 8 * response->headers.size() + replay_size(*response) : 0));
  out.append(kMagic);
  out.append(reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size());
  std::uint8_t flags = 0;
  if (response) flags |= kHasResponse;
  if (response && response->body_omitted) flags |= kBodyOmitted;
  out.push_back(static_cast<char>(flags));
  if (!response) return out;
  put_u16(out, response->status);
  put_u32(out, static_cast<std::uint32_t>(response->headers.size()));
  for (const auto& [name, value] : response->headers) {
    put_bytes(out, name);
    put_bytes(out, value);
  }
  put_bytes(out, response->body);
  return out;
}

std::optional<ReplayMarker> decode_replay_marker(std::string_view value) {
  if (!is_replay_marker(value)) return std::nullopt;
  Reader in(value.substr(kMagic.size()));
  ReplayMarker marker;
  const auto fp = in.take(marker.fingerprint.size());
  const auto flags = static_cast<std::uint8_t>(in.u(1));
  if (!in.ok() || (flags & ~(kHasResponse | kBodyOmitted)) != 0) return std::nullopt;
  for (std::size_t i = 0; i < fp.size(); ++i)
    marker.fingerprint[i] = static_cast<std::uint8_t>(fp[i]);
  if ((flags & kHasResponse) == 0) {
    // Without a response there is no body to omit: one encoding per marker.
    if (flags != 0 || !in.at_end()) return std::nullopt;
    return marker;
  }
  StoredResponse r;
  r.body_omitted = (flags & kBodyOmitted) != 0;
  r.status = static_cast<std::uint16_t>(in.u(2));
  if (r.status < 100 || r.status > 599) return std::nullopt;  // as a stored record's (C16)
  const std::uint32_t count = in.u(4);
  // Each header takes at least 8 bytes: a count larger than what is left is malformed, and
  // checking it first keeps a corrupt count from reserving gigabytes.
  if (!in.ok() || count > value.size() / 8) return std::nullopt;
  r.headers.reserve(count);
  for (std::uint32_t i = 0; i < count && in.ok(); ++i) {
    const auto name = in.bytes();
    const auto field = in.bytes();
    r.headers.emplace_back(std::string(name), std::string(field));
  }
  r.body = std::string(in.bytes());
  if (!in.ok() || !in.at_end()) return std::nullopt;
  marker.response = std::move(r);
  return marker;
}

}  // namespace idemgate::core
