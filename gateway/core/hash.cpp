#include "gateway/core/hash.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <new>
#include <stdexcept>
#include <vector>

#include "gateway/common/hex.hpp"

namespace idemgate::core {
namespace {

EVP_MD_CTX* md(void* p) {
  return static_cast<EVP_MD_CTX*>(p);
}

/// SHA-256 fetched from the default provider once: EVP_sha256() makes every EVP_DigestInit_ex
/// look the implementation up again (a property query under a lock, OpenSSL 3).
const EVP_MD* sha256_md() {
  static EVP_MD* const fetched = [] {
    EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (md == nullptr) throw std::runtime_error("EVP_MD_fetch(SHA256) failed");
    return md;
  }();
  return fetched;
}

/// Digest contexts a thread has finished with, reused by its next builders (a few may be alive
/// at once, across the suspension points of coroutines on one thread).
class ContextCache {
 public:
  ContextCache() = default;
  ContextCache(const ContextCache&) = delete;
  ContextCache& operator=(const ContextCache&) = delete;
  ~ContextCache() {
    for (auto* ctx : free_) EVP_MD_CTX_free(ctx);
  }

  EVP_MD_CTX* take() {
    if (free_.empty()) return EVP_MD_CTX_new();
    auto* ctx = free_.back();
    free_.pop_back();
    return ctx;
  }

  void give_back(EVP_MD_CTX* ctx) {
    if (free_.size() < kKept) {
      free_.push_back(ctx);
    } else {
      EVP_MD_CTX_free(ctx);
    }
  }

 private:
  static constexpr std::size_t kKept = 8;
  std::vector<EVP_MD_CTX*> free_;
};

ContextCache& context_cache() {
  thread_local ContextCache cache;
  return cache;
}

}  // namespace

Sha256Builder::Sha256Builder() : ctx_(context_cache().take()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
  if (EVP_DigestInit_ex2(md(ctx_), sha256_md(), nullptr) != 1) {
    EVP_MD_CTX_free(md(ctx_));
    throw std::runtime_error("EVP_DigestInit_ex2(sha256) failed");
  }
}

Sha256Builder::~Sha256Builder() {
  // Contexts are not tied to a thread: the one that destroys the builder keeps it.
  context_cache().give_back(md(ctx_));
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
  return common::hex(digest.data(), digest.size());
}

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(sha256_md(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &size);
  return common::hex(out, size);
}

std::string random_token() {
  unsigned char bytes[16];
  random_bytes(bytes, sizeof bytes);
  return common::hex(bytes, sizeof bytes);
}

}  // namespace idemgate::core
