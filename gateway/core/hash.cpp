#include "gateway/core/hash.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <new>
#include <stdexcept>

namespace idemgate::core {
namespace {

EVP_MD_CTX* md(void* p) {
  return static_cast<EVP_MD_CTX*>(p);
}

constexpr char kHex[] = "0123456789abcdef";

std::string hex_of(const unsigned char* data, std::size_t size) {
  std::string out(size * 2, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 0x0f];
  }
  return out;
}

}  // namespace

Sha256Builder::Sha256Builder() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
  if (EVP_DigestInit_ex(md(ctx_), EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(md(ctx_));
    throw std::runtime_error("EVP_DigestInit_ex(sha256) failed");
  }
}

Sha256Builder::~Sha256Builder() {
  EVP_MD_CTX_free(md(ctx_));
}

Sha256Builder& Sha256Builder::update(std::string_view bytes) {
  EVP_DigestUpdate(md(ctx_), bytes.data(), bytes.size());
  return *this;
}

Sha256Builder& Sha256Builder::field(std::string_view bytes) {
  unsigned char len[8];
  auto n = static_cast<std::uint64_t>(bytes.size());
  for (int i = 7; i >= 0; --i) {
    len[i] = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  EVP_DigestUpdate(md(ctx_), len, sizeof len);
  return update(bytes);
}

Sha256 Sha256Builder::finish() {
  Sha256 out{};
  unsigned int size = 0;
  EVP_DigestFinal_ex(md(ctx_), out.data(), &size);
  return out;
}

std::string to_hex(const Sha256& digest) {
  return hex_of(digest.data(), digest.size());
}

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &size);
  return hex_of(out, size);
}

std::string random_token() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  return hex_of(bytes, sizeof bytes);
}

}  // namespace idemgate::core
