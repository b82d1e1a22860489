#include "tests/support/process_memory.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

namespace idemgate::test {

RssSampler::RssSampler(pid_t pid) : path_("/proc/" + std::to_string(pid) + "/status") {
  thread_ = std::thread([this] {
    while (!stop_) {
      max_ = std::max(max_.load(), rss());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

RssSampler::~RssSampler() {
  stop_ = true;
  thread_.join();
}

std::uint64_t RssSampler::rss() const {
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

SmallAsanQuarantine::SmallAsanQuarantine() {
  if (const char* old = std::getenv("ASAN_OPTIONS")) saved_ = old;
  const std::string options = (saved_ ? *saved_ + ":" : std::string()) + "quarantine_size_mb=4";
  ::setenv("ASAN_OPTIONS", options.c_str(), 1);
}

SmallAsanQuarantine::~SmallAsanQuarantine() {
  if (saved_) {
    ::setenv("ASAN_OPTIONS", saved_->c_str(), 1);
  } else {
    ::unsetenv("ASAN_OPTIONS");
  }
}

}  // namespace idemgate::test
