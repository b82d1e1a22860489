#include "gateway/core/primary_tracker.hpp"

#include <utility>

namespace idemgate::core {

void PrimaryTracker::use(const std::string& scope, const std::string& primary) {
  const std::lock_guard lock(mutex_);
  auto [it, first] = primaries_.try_emplace(scope, primary);
  if (first || it->second == primary) return;
  const std::string from = std::exchange(it->second, primary);
  ++switches_;
  if (on_switch_) on_switch_(from, primary);
}

std::uint64_t PrimaryTracker::switches() const {
  const std::lock_guard lock(mutex_);
  return switches_;
}

}  // namespace idemgate::core
