#pragma once
// The memory of a child process, as tests that bound it read it (SPEC C38 streaming, C54 bounded
// queues): its resident set sampled on a thread of the test, and a smaller ASan quarantine for
// the children started meanwhile.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

namespace idemgate::test {

/// Samples VmRSS of a process every 20 ms on its own thread, keeping the maximum.
///
/// @par Thread Safety
/// rss() and max() may be called from any thread.
class RssSampler {
 public:
  explicit RssSampler(pid_t pid);
  ~RssSampler();
  RssSampler(const RssSampler&) = delete;
  RssSampler& operator=(const RssSampler&) = delete;

  /// VmRSS now, in bytes (0 when unreadable).
  std::uint64_t rss() const;
  /// The largest VmRSS sampled so far, in bytes.
  std::uint64_t max() const { return max_; }

 private:
  std::string path_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> max_{0};
  std::thread thread_;
};

/// How far a gateway's RSS may grow when it takes on `bytes` of memory of its own, in this build:
/// `bytes` in plain and ASan builds (ASan's shadow is an eighth, and SmallAsanQuarantine bounds
/// its quarantine), twice that under TSan, whose shadow and metadata pages grow with every
/// application page the gateway touches (the TSan documentation gives 5–10× memory overall).
constexpr std::uint64_t rss_allowance(std::uint64_t bytes) {
#if defined(__SANITIZE_THREAD__)
  return 2 * bytes;
#else
  return bytes;
#endif
}

/// ASan holds freed memory in a quarantine (256 MiB by default) before reusing it, so under
/// the sanitizer a gateway that frees every piece it allocates still grows its RSS by that much.
/// While this object lives, children started get a small quarantine (ASAN_OPTIONS in this
/// process's environment), so that an RSS bound measures what the gateway holds, as a build
/// without the sanitizer would. No effect on other builds.
class SmallAsanQuarantine {
 public:
  SmallAsanQuarantine();
  ~SmallAsanQuarantine();
  SmallAsanQuarantine(const SmallAsanQuarantine&) = delete;
  SmallAsanQuarantine& operator=(const SmallAsanQuarantine&) = delete;

 private:
  std::optional<std::string> saved_;
};

}  // namespace idemgate::test
