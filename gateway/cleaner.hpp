#pragma once
// Deletes expired idempotency records in the background (SPEC C24): every `cleanup.interval`,
// batches of `cleanup.batch` rows, each batch its own short statement (no long locks; rows being
// replaced right now are skipped). Once `idemgate migrate --partitions N` has hash-partitioned
// the table, each round works partition by partition, each batch a statement on one partition.
// Expired rows are already invisible to lookups, so the cleaner only bounds the table's size.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <thread>

#include "gateway/config/config.hpp"
#include "gateway/core/primary_tracker.hpp"

namespace idemgate {

/// Runs on a thread and io_context of its own with one Postgres connection, so it never competes
/// with request threads for theirs. Several gateways may run one each: batches skip rows another
/// cleaner holds. Thread-safe: start/stop from one controlling thread; deleted_total() anywhere.
class Cleaner {
 public:
  /// `pg_primary` (may be null): the process's tracker of the Postgres host in use (SPEC C46).
  explicit Cleaner(const config::Config& config,
                   std::shared_ptr<core::PrimaryTracker> pg_primary = nullptr);
  ~Cleaner();
  Cleaner(const Cleaner&) = delete;
  Cleaner& operator=(const Cleaner&) = delete;

  /// Starts the background thread; the first round runs one interval after start.
  void start();
  /// Stops the thread, abandoning a round in progress (its statement ends with the connection).
  void stop();

  /// Rows deleted since start (feeds idemgate_cleanup_deleted_total).
  std::uint64_t deleted_total() const { return deleted_total_.load(std::memory_order_relaxed); }
  /// Unix time in seconds of the last cleanup statement that succeeded (a round is one or more
  /// statements); the time of start() until one has, 0 before start(). Feeds
  /// idemgate_cleaner_last_run_timestamp_seconds: a value that stops advancing means the
  /// cleaner cannot reach Postgres.
  double last_run() const { return last_run_.load(std::memory_order_relaxed); }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::atomic<std::uint64_t> deleted_total_{0};
  std::atomic<double> last_run_{0};
  std::thread thread_;
};

}  // namespace idemgate
