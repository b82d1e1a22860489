#pragma once
// Waiting for state that offers no event to wait on (a row in Postgres, a key in Redis, a count
// of answers): polling with a safety deadline that only turns a hang into a failure and measures
// nothing. A test never asserts how soon the state came (STYLE): SPEC bounds are in
// spec_bounds.hpp.

#include <chrono>
#include <functional>
#include <thread>

namespace idemgate::test {

/// How long a test waits for an event (a process listening, a request arriving, a load running)
/// before it fails: a safety net against hangs, not a measured threshold.
inline constexpr std::chrono::seconds kEventDeadline{30};

/// The pause between two looks of a poll.
inline constexpr std::chrono::milliseconds kPollInterval{10};

/// Polls `condition` every `interval` until it holds (true) or `deadline` has passed (false).
/// The condition is always looked at once, however late it is.
inline bool eventually_by(std::chrono::steady_clock::time_point deadline,
                          const std::function<bool()>& condition,
                          std::chrono::milliseconds interval = kPollInterval) {
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(interval);
  }
  return true;
}

/// eventually_by(now + kEventDeadline, condition, interval).
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds interval = kPollInterval) {
  return eventually_by(std::chrono::steady_clock::now() + kEventDeadline, condition, interval);
}

}  // namespace idemgate::test
