#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "gateway/common/random.hpp"

namespace idemgate::core {

/// A SHA-256 digest (32 bytes).
using Sha256 = std::array<std::uint8_t, 32>;

/// Incremental SHA-256 (OpenSSL EVP). Not thread-safe; one per computation.
class Sha256Builder {
 public:
  Sha256Builder();
  ~Sha256Builder();
  Sha256Builder(const Sha256Builder&) = delete;
  Sha256Builder& operator=(const Sha256Builder&) = delete;

  /// Appends raw bytes.
  Sha256Builder& update(std::string_view bytes);
  /// Appends a field framed by its 8-byte big-endian length, so that concatenations of
  /// different field lists can never collide ("ab"+"c" ≠ "a"+"bc").
  Sha256Builder& field(std::string_view bytes);
  Sha256 finish();

 private:
  void* ctx_;  // EVP_MD_CTX*
};

/// Lower-case hex of a digest (64 characters).
std::string to_hex(const Sha256& digest);

/// HMAC-SHA-256 of `data` under `key`, lower-case hex (SPEC C14 `upstream_key: rewrite`).
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

/// Random bytes from OpenSSL's CSPRNG (gateway/common/random.hpp).
using common::random_bytes;

/// 128 random bits from OpenSSL's CSPRNG as 32 hex characters (lock owner tokens, C23).
std::string random_token();

}  // namespace idemgate::core
