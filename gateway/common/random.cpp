#include "gateway/common/random.hpp"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>

namespace idemgate::common {
namespace {

inline constexpr std::size_t kBlock = 4096;

/// Bumped in a forked child: every thread's buffer filled before the fork is stale there.
std::atomic<unsigned> fork_generation{0};

void on_fork_child() {
  fork_generation.fetch_add(1, std::memory_order_relaxed);
}

struct Buffer {
  std::array<unsigned char, kBlock> bytes{};
  std::size_t used = kBlock;  // empty until the first draw
  unsigned generation = 0;

  Buffer() {
    static const int registered = pthread_atfork(nullptr, nullptr, on_fork_child);
    (void)registered;
  }
  ~Buffer() { OPENSSL_cleanse(bytes.data(), bytes.size()); }

  void refill() {
    if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
      throw std::runtime_error("RAND_bytes failed");
    }
    used = 0;
    generation = fork_generation.load(std::memory_order_relaxed);
  }
};

}  // namespace

void random_bytes(unsigned char* out, std::size_t n) {
  if (n > kBlock) {
    if (RAND_bytes(out, static_cast<int>(n)) != 1) throw std::runtime_error("RAND_bytes failed");
    return;
  }
  thread_local Buffer buffer;
  if (buffer.generation != fork_generation.load(std::memory_order_relaxed)) buffer.used = kBlock;
  if (kBlock - buffer.used < n) buffer.refill();
  std::memcpy(out, buffer.bytes.data() + buffer.used, n);
  OPENSSL_cleanse(buffer.bytes.data() + buffer.used, n);
  buffer.used += n;
}

}  // namespace idemgate::common
