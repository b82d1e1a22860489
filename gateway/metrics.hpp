#pragma once
// The gateway's Prometheus metrics (SPEC C31) and the timing decorators that feed the store
// histogram. The registry is process-wide; the io threads update it, the admin thread renders it.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "gateway/common/deadline_list.hpp"
#include "gateway/core/lock_service.hpp"
#include "gateway/core/record_store.hpp"

namespace idemgate {

/// Every metric the gateway exports, in one prometheus-cpp Registry:
///
/// - `idemgate_requests_total{route,outcome}`: one per answered request; `outcome` is the access
///   log's (passthrough, executed, replayed, mismatch, in_flight, missing_key, invalid_key,
///   store_unavailable, upstream_error, not_stored; and rejected, no_route, internal_error for
///   requests the session answered itself, with `route=""` when none matched).
/// - `idemgate_upstream_duration_seconds{route}`: histogram of upstream exchanges.
/// - `idemgate_store_duration_seconds{store,op}`: histogram of store operations; store is
///   `postgres` (op find, insert) or `redis` (op try_acquire, renew, release, replace).
/// - counters `idemgate_lock_contention_total`, `idemgate_duplicate_executions_total` (C36),
///   `idemgate_record_commit_failures_total` (C26), `idemgate_cleanup_deleted_total` (C24).
/// - counter `idemgate_store_failovers_total{store}` (C46): switches to a different Redis
///   primary (`redis`) or Postgres host (`postgres`); both series exist from the start at 0.
/// - gauge `idemgate_open_tunnels` (upgrade tunnels open now, C40).
/// - HTTP/2 (C49–C51): gauge `idemgate_h2_connections` (open now), counter
///   `idemgate_h2_streams_total` (requests that came as streams; also in
///   `idemgate_requests_total`), counter `idemgate_h2_connections_ended_total{reason}` (ended
///   for passing a C51 bound: continuation_flood, flood, header_bomb, rapid_reset,
///   zero_window).
/// - gauges `idemgate_client_connections` (client connections open, SPEC C52) and
///   `idemgate_in_flight_locks` (in-flight locks held by this process, including ones kept on
///   purpose until their lock_ttl).
/// - overload (SPEC §7), once set_overload_source was called: counter
///   `idemgate_accept_paused_seconds_total` (time the acceptors were paused at max_connections
///   or for lack of descriptors, C52), gauges `idemgate_max_connections` (the limit in force)
///   and `idemgate_pending_commits` (places taken in the Postgres commit queue, C54). Shed
///   requests are `idemgate_requests_total{outcome="shed"}` (C53, C54, max_tunnels).
/// - gauge `idemgate_ready`: 1 when the last readiness check (the `/readyz` rule, C30) passed,
///   else 0; the admin listener checks on each `/readyz` and each `/metrics` request.
/// - gauges `idemgate_cleaner_last_run_timestamp_seconds` (Unix time of the cleaner's last
///   successful statement, C24; its start time until then) and `idemgate_cleaner_interval_seconds`
///   (`cleanup.interval`), once set_cleaner_source was called.
///
/// @par Thread safety
/// Every member is thread-safe (prometheus-cpp metrics are atomic; families lock to add a label
/// set). The per-request observations (count_request, observe_upstream, observe_store) write
/// numbers of the calling thread's own (one writer each, relaxed atomics), found through a cache
/// of that thread; render() adds the threads' numbers up. No lock is taken per observation.
class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void count_request(std::string_view route, std::string_view outcome);
  void observe_upstream(std::string_view route, std::chrono::microseconds duration);
  void observe_store(const char* store, const char* op, std::chrono::nanoseconds duration);
  void count_lock_contention();
  void count_duplicate_execution();
  void count_record_commit_failure();
  /// idemgate_store_errors_total{op}: one failed store operation (`op` as FilterEvents reports
  /// it: "record lookup", "lock acquire", "record commit", "lock renew", ...).
  void count_store_error(std::string_view op);
  /// idemgate_store_failovers_total{store}: this process switched to another primary of `store`
  /// ("redis" or "postgres", SPEC C46).
  void count_store_failover(std::string_view store);
  /// idemgate_task_failures_total{task}: a background task that ended with an exception.
  void count_task_failure(std::string_view task);
  void connection_opened();
  void connection_closed();
  /// idemgate_open_tunnels (SPEC C40).
  void tunnel_opened();
  void tunnel_closed();
  void h2_connection_opened();
  void h2_connection_closed();
  void count_h2_stream();
  void count_h2_cut(std::string_view reason);
  void lock_taken();
  void lock_freed();

  /// Where idemgate_cleanup_deleted_total comes from (Cleaner::deleted_total); read on render.
  void set_cleanup_source(std::function<std::uint64_t()> source);
  /// Where idemgate_cleaner_last_run_timestamp_seconds comes from (Cleaner::last_run, Unix
  /// seconds; read on render), and the cleaner's `cleanup.interval` for
  /// idemgate_cleaner_interval_seconds. Both series are exported from the first call on; a null
  /// `last_run` keeps the last value read.
  void set_cleaner_source(std::function<double()> last_run, std::chrono::milliseconds interval);
  /// idemgate_ready: the result of the latest readiness check (SPEC C30).
  void set_ready(bool ready);

  /// What the overload series are read from (SPEC §7), at each render.
  struct OverloadReadings {
    double accept_paused_seconds = 0;  ///< total since start (only ever grows)
    std::size_t max_connections = 0;   ///< the limit in force
    std::size_t pending_commits = 0;   ///< places taken in the commit queue now
  };
  /// Where the overload series come from; they are exported from the first call on. null: stop
  /// reading (the series keep their last values).
  void set_overload_source(std::function<OverloadReadings()> source);
  /// A request went out without deduplication (fail_open, C25). Any thread; lock-free.
  void note_unprotected() noexcept;
  /// Whether note_unprotected() was called within `window` before now (C58: `degraded`).
  bool unprotected_within(std::chrono::steady_clock::duration window) const noexcept;

  /// The Prometheus text exposition format (version 0.0.4) of every metric.
  std::string render();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  /// The per-request families keep their numbers per thread (metrics.cpp): an observation writes
  /// only its thread's numbers, without a lock or a line shared with the other io threads.
  class ShardedFamily;
  std::unique_ptr<ShardedFamily> requests_;
  std::unique_ptr<ShardedFamily> upstream_duration_;
  std::unique_ptr<ShardedFamily> store_duration_;
  prometheus::Counter& lock_contention_;
  prometheus::Counter& duplicate_executions_;
  prometheus::Counter& commit_failures_;
  prometheus::Family<prometheus::Counter>& store_errors_;
  prometheus::Family<prometheus::Counter>& task_failures_;
  prometheus::Family<prometheus::Counter>& store_failovers_;
  prometheus::Counter& cleanup_deleted_;
  prometheus::Gauge& client_connections_;
  prometheus::Family<prometheus::Counter>& accept_paused_;
  prometheus::Family<prometheus::Gauge>& max_connections_;
  prometheus::Family<prometheus::Gauge>& pending_commits_;
  prometheus::Gauge& in_flight_locks_;
  prometheus::Gauge& open_tunnels_;
  prometheus::Gauge& h2_connections_;
  prometheus::Counter& h2_streams_;
  prometheus::Family<prometheus::Counter>& h2_cuts_;
  prometheus::Gauge& ready_;
  prometheus::Family<prometheus::Gauge>& cleaner_last_run_;
  prometheus::Family<prometheus::Gauge>& cleaner_interval_;

  std::mutex render_mutex_;

  /// steady_clock ticks of the last note_unprotected(); min(): never.

  std::atomic<std::chrono::steady_clock::rep> last_unprotected_{

      std::numeric_limits<std::chrono::steady_clock::rep>::min()};
  std::function<std::uint64_t()> cleanup_source_;
  std::function<double()> cleaner_last_run_source_;
  std::function<OverloadReadings()> overload_source_;

  struct ThreadCache;
  /// The calling thread's cache of this instance's children.
  ThreadCache& thread_cache();
  const std::uint64_t id_;  ///< unique per instance: a thread's cache never outlives its owner
};

/// A RecordStore that times each call of `inner` into `idemgate_store_duration_seconds{store=
/// "postgres"}`. Same contract, thread affinity and errors as `inner`, which must outlive it.
class TimedRecordStore final : public core::RecordStore {
 public:
  TimedRecordStore(core::RecordStore& inner, Metrics& metrics) : inner_(inner), metrics_(metrics) {}

  boost::asio::awaitable<boost::system::result<std::optional<core::StoredRecord>>> find(
      core::Sha256 id) override;
  boost::asio::awaitable<boost::system::result<core::InsertResult>> insert(
      core::StoredRecord record, std::chrono::milliseconds ttl) override;

 private:
  core::RecordStore& inner_;
  Metrics& metrics_;
};

/// A LockService that times each call of `inner` into `idemgate_store_duration_seconds{store=
/// "redis"}` (op `try_acquire` for acquire) and keeps `idemgate_in_flight_locks`: +1 when acquire
/// takes a lock, -1 when its owner releases it or replaces it by the committed marker, loses it on
/// renew, or when its ttl (as last set) has run out. Same contract and errors as `inner`, which
/// must outlive it. One per io thread, like `inner`.
class TimedLockService final : public core::LockService {
 public:
  TimedLockService(core::LockService& inner, Metrics& metrics) : inner_(inner), metrics_(metrics) {}
  ~TimedLockService() override;
  TimedLockService(const TimedLockService&) = delete;
  TimedLockService& operator=(const TimedLockService&) = delete;

  boost::asio::awaitable<boost::system::result<core::Acquired>> acquire(
      core::Sha256 id, std::string token, std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<boost::system::result<bool>> renew(core::Sha256 id, std::string token,
                                                            std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<boost::system::result<bool>> release(core::Sha256 id,
                                                              std::string token) override;
  boost::asio::awaitable<boost::system::result<bool>> replace(
      core::Sha256 id, std::string token, std::string value,
      std::chrono::milliseconds ttl) override;

 private:
  void hold(const boost::asio::any_io_executor& executor, const std::string& token,
            std::chrono::milliseconds ttl);
  void forget(const std::string& token);

  /// A lock this thread holds: due when its ttl (as last set) runs out.
  struct Held : common::DeadlineList::Entry {
    Held() = default;
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() {
      if (is_linked()) owner->expiries_->remove(*this);
    }
    TimedLockService* owner = nullptr;
    const std::string* token = nullptr;  ///< its key in held_
  };

  core::LockService& inner_;
  Metrics& metrics_;
  /// The ttls of held_, one timer for all (made on first use with the thread's executor).
  std::unique_ptr<common::DeadlineList> expiries_;
  /// Locks this thread holds, by owner token (a node keeps its place: the entry lives in it).
  std::map<std::string, Held, std::less<>> held_;
};

}  // namespace idemgate
