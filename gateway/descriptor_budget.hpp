#pragma once
// What the process's descriptor limit leaves for client connections (SPEC C52): the default of
// `limits.max_connections`, computed at start so that the connections already open never lack
// a descriptor for their upstream and store connections.

#include <cstdint>
#include <string>

#include "gateway/config/config.hpp"

namespace idemgate {

/// The descriptor budget of one gateway process.
struct DescriptorBudget {
  std::uint64_t open_files = 0;  ///< RLIMIT_NOFILE in force (soft)
  /// Descriptors kept for everything but client connections and their upstream sides: the
  /// process itself, each io thread's event loop and listener, the admin listener, the store
  /// connections, and the upstream pools' idle connections.
  std::uint64_t reserved = 0;
  /// (open_files − reserved) / 2, at least 1: each client connection may need one upstream
  /// connection at the same time (a request being forwarded or streamed, or a tunnel).
  std::uint64_t max_connections = 0;
};

/// The budget for `config` under a limit of `open_files` descriptors. Pure. What is reserved,
/// with `threads` = config.threads (≥ 1):
/// - 32 for the process (standard streams, the log writer, the resolver, signals, files read at
///   start), 4 per io thread (event loop, wake-ups, timers, listener), 24 for the admin
///   listener (itself, its at most 16 connections, its own store probes);
/// - Postgres: threads × ceil(pool_size / threads) for the request pools, 1 for the cleaner,
///   two descriptors each (libpq's socket and the duplicate the event loop waits on);
/// - Redis per io thread (twice with wait_replicas): 1 connection to a single server, sentinels
///   + 1 under Sentinel, 2 × max(3, seed nodes) for a Cluster (seed and primary connections);
/// - each upstream: max_idle_connections × threads idle pooled connections.
DescriptorBudget descriptor_budget(const config::Config& config, std::uint64_t open_files);

/// Raises the soft RLIMIT_NOFILE to the hard limit (SPEC C52) and returns the soft limit then in
/// force. `error` is set when raising failed (the old limit is returned).
std::uint64_t raise_open_file_limit(std::string& error);

}  // namespace idemgate
