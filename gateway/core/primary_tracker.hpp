#pragma once
// Which primary of a store a process uses, so that a switch to another one is counted and
// logged once per process (SPEC C46), however many io threads and connections notice it.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace idemgate::core {

/// The primary in use per scope, shared by every client of one store in a process (each io
/// thread's Redis client, each Postgres pool: request threads, the admin probe, the cleaner).
///
/// @par Thread safety
/// All members may be called from any thread.
class PrimaryTracker {
 public:
  /// Called (under the tracker's lock, so keep it short) once per switch with the primary in use
  /// before and after, both as `host:port`.
  using OnSwitch = std::function<void(const std::string& from, const std::string& to)>;

  explicit PrimaryTracker(OnSwitch on_switch = {}) : on_switch_(std::move(on_switch)) {}

  /// Records that `primary` (`host:port`) now serves `scope` (empty for a store with one primary:
  /// Sentinel, Postgres; the slot range's first slot in a Redis Cluster). The first primary of a
  /// scope is not a switch; a different one afterwards is, and calls on_switch.
  void use(const std::string& scope, const std::string& primary);

  /// Number of switches seen so far.
  std::uint64_t switches() const;

 private:
  mutable std::mutex mutex_;
  OnSwitch on_switch_;
  std::map<std::string, std::string> primaries_;
  std::uint64_t switches_ = 0;
};

}  // namespace idemgate::core
