// Stand-in for the parts of storage/redis/redis_client.cpp that the cluster client calls, linked
// into the cluster tests only while that file is not part of idemgate_redis yet (see
// tests/redis_cluster.cmake). Same behaviour as documented in redis_client.hpp.

#include "storage/redis/redis_client.hpp"

namespace idemgate::storage::redis {

void PrimaryTracker::use(const std::string& scope, const std::string& primary) {
  std::lock_guard lock(mutex_);
  auto [it, first] = primaries_.try_emplace(scope, primary);
  if (first || it->second == primary) return;
  const auto from = it->second;
  it->second = primary;
  ++switches_;
  if (on_switch_) on_switch_(from, primary);
}

std::uint64_t PrimaryTracker::switches() const {
  std::lock_guard lock(mutex_);
  return switches_;
}

std::string endpoint_text(const std::string& host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace idemgate::storage::redis
