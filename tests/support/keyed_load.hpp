#pragma once
// Steady keyed load against running gateways, and the checks the scale suites make of what it
// got: every answer of an allowed kind, every answered key replayed byte for byte.

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/answers.hpp"

namespace idemgate::test {

/// One key of a load: its request and every answer it got, in order.
struct KeyRecord {
  HttpRequest request;
  std::vector<Timed> answers;
};

/// Client threads that each send a new key at a time until stop(), recording every answer.
///
/// @par Thread Safety
/// The counting members may be called while the load runs; records() only once it stopped.
class KeyedLoad {
 public:
  struct Options {
    /// A request with a key never sent before (called by several threads at once).
    std::function<HttpRequest()> new_request;
    /// Sends a request to instance `instance` and returns its answer.
    std::function<Timed(const HttpRequest&, int instance)> send;
    int threads = 4;
    int instances = 1;  ///< thread t sends its keys to instance t % instances
    /// After an answer, the same request once more to the next instance, (i + 1) % instances.
    bool retry_elsewhere = false;
    Clock::duration pace{};  ///< each thread's pause between two keys
  };

  /// Options that send new_request()'s keys to the instances of `gateway` (which must outlive
  /// the load), spread over them.
  static Options on(const e2e::Gateway& gateway, std::function<HttpRequest()> new_request);

  explicit KeyedLoad(Options options);
  ~KeyedLoad();
  KeyedLoad(const KeyedLoad&) = delete;
  KeyedLoad& operator=(const KeyedLoad&) = delete;

  void start();
  /// Joins the threads once their requests are answered. Idempotent.
  void stop();

  /// Answers recorded so far for which `which` holds.
  std::size_t count(const std::function<bool(const Timed&)>& which) const;
  /// Answers recorded so far that executed.
  std::size_t executions() const;
  /// Answers recorded so far of kind `kind` (kind_of) to requests sent at or after `after`.
  std::size_t answers_of_kind(const std::string& kind, Clock::time_point after) const;
  /// Successes recorded so far to requests sent after `after`.
  std::size_t successes_after(Clock::time_point after) const;
  /// The end of the first execution on `instance` of a request sent at or after `after`.
  std::optional<Clock::time_point> first_execution(int instance, Clock::time_point after) const;

  /// Waits until executions() ≥ n; false after kEventDeadline.
  bool wait_for_executions(std::size_t n) const;
  /// Waits until every instance executed a request sent at or after `after`; returns each
  /// instance's first such moment (nullopt for one that did not within kEventDeadline of
  /// `after`).
  std::vector<std::optional<Clock::time_point>> wait_for_recovery(Clock::time_point after) const;

  /// Every key with its answers, once stopped.
  std::vector<KeyRecord>& records() { return records_; }
  const std::vector<KeyRecord>& records() const { return records_; }

 private:
  void run(int thread);

  Options options_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  mutable std::mutex mutex_;
  std::vector<KeyRecord> records_;
};

/// What the answers of a load add up to.
struct LoadTally {
  std::map<std::string, int> kinds;   ///< answers by kind_of
  std::size_t keys_answered_2xx = 0;  ///< keys with at least one success
  std::int64_t slowest_ms = 0;
};

/// What check_answers() asserts beyond an answer of an allowed kind.
struct AnswerChecks {
  /// Every answer within this time: a SPEC bound (with its margin), e.g. C25's operation_timeout
  /// plus spec::kStoreFaultMargin. Unset: no bound.
  std::optional<Clock::duration> bound{};
  /// Every success of a key after its first is a replay of it, byte for byte (C16).
  bool later_successes_replay_the_first = false;
};

/// Checks every answer of `records`: an answer at all, of an allowed kind (allowed_kind), and
/// `checks`. Reports the first five failures in full (with the gateways' diagnostics), then
/// counts the rest. Returns the tally.
LoadTally check_answers(const std::vector<KeyRecord>& records, const e2e::Gateway& gateway,
                        const AnswerChecks& checks = {});

/// Every key of `records` answered with a success is sent again now, through the instance after
/// the one that gave its first success, and must replay that answer byte for byte (C16, C36).
/// Returns how many keys were checked.
std::size_t check_replays(const std::vector<KeyRecord>& records, const e2e::Gateway& gateway);

/// One request from `new_request` per instance of `gateway` must execute: the gateways serve
/// before the scenario disturbs anything. Stops the test otherwise.
void warm_up(const e2e::Gateway& gateway, const std::function<HttpRequest()>& new_request);

}  // namespace idemgate::test
