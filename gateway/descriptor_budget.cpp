#include "gateway/descriptor_budget.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace idemgate {

DescriptorBudget descriptor_budget(const config::Config& config, std::uint64_t open_files) {
  const std::uint64_t threads = static_cast<std::uint64_t>(std::max(1, config.threads));
  std::uint64_t reserved = 32 + 4 * threads + 24;

  const auto pool = static_cast<std::uint64_t>(std::max(1, config.storage.postgres.pool_size));
  // Two per connection: libpq's socket and the duplicate Asio waits on (PgConnection).
  reserved += 2 * (threads * ((pool + threads - 1) / threads) + 1);

  const config::Redis& redis = config.storage.redis;
  std::uint64_t per_client = 1;
  switch (redis.mode) {
    case config::Redis::Mode::standalone:
      per_client = 1;
      break;
    case config::Redis::Mode::sentinel:
      per_client = redis.sentinels.size() + 1;
      break;
    case config::Redis::Mode::cluster:
      per_client = 2 * std::max<std::uint64_t>(3, redis.cluster.size());
      break;
  }
  reserved += threads * per_client * (redis.wait_replicas > 0 ? 2 : 1);

  for (const auto& [name, upstream] : config.upstreams) {
    reserved += threads * static_cast<std::uint64_t>(std::max(0, upstream.max_idle_connections));
  }

  DescriptorBudget budget;
  budget.open_files = open_files;
  budget.reserved = reserved;
  budget.max_connections = open_files > reserved + 2 ? (open_files - reserved) / 2 : 1;
  return budget;
}

std::uint64_t raise_open_file_limit(std::string& error) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    error = std::strerror(errno);
    return 1024;
  }
  if (limit.rlim_cur != limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    } else {
      error = std::strerror(errno);
    }
  }
  // RLIM_INFINITY is a very large number: the budget then is bounded by the key's range.
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

}  // namespace idemgate
