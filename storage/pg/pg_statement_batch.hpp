#pragma once
// Batching of one kind of statement for one io thread: the queue, the flushers and the waiting
// that PgBatchWriter (record inserts) and PgBatchReader (record lookups) share.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "storage/pg/pg_connection.hpp"

namespace idemgate::storage::pg {

/// One caller's part of a batch: its row's id (two items with one id never share a batch), its
/// deadline, and the timer its caller sleeps on. A derived type adds the row and the outcome and
/// settles the item once (settle_once()).
class BatchItem {
 public:
  BatchItem(boost::asio::any_io_executor executor, Deadline deadline);
  virtual ~BatchItem() = default;
  BatchItem(const BatchItem&) = delete;
  BatchItem& operator=(const BatchItem&) = delete;

  /// The id the row is keyed by (bytes).
  virtual std::string_view id() const noexcept = 0;
  /// Settles the item with an error, when it is not settled yet.
  virtual void fail(boost::system::error_code ec) = 0;

  Deadline deadline() const noexcept { return deadline_; }
  bool settled() const noexcept { return settled_; }
  /// The caller stopped waiting (timed out, or its coroutine was destroyed): left out of any
  /// batch that has not left yet.
  bool abandoned() const noexcept { return abandoned_; }

 protected:
  /// true the first time: the derived type then stores its outcome. Wakes the caller.
  bool settle_once();

 private:
  friend class StatementBatch;
  Deadline deadline_;
  boost::asio::steady_timer wake_;  ///< expires at the deadline; cancelled when settled
  bool settled_ = false;
  bool abandoned_ = false;
};

/// Concurrent calls of one io thread queued and sent as one statement per batch. A batch
/// leaves at once while fewer than Options::max_in_flight are out, else as soon as one of them
/// returns: under load, the calls that arrive while a statement runs ride on the next one; a
/// single caller's batch of one leaves at once (no added delay). Items whose caller stopped
/// waiting or whose deadline passed are left out.
///
/// @par Errors
/// submit() returns false when the item's deadline passed before it was settled (its statement
/// may still run). Items queued when the batch is destroyed fail with `unavailable`.
///
/// @par Thread safety
/// None: one per io thread. Batches already sent finish after it is destroyed (their `send`
/// function is kept alive with them); queued items are not sent.
class StatementBatch {
 public:
  struct Options {
    std::size_t max_batch = 256;  ///< items per statement
    /// Statements out at once, each on its own pooled connection. With one, the next batch
    /// collects for as long as the statement out takes (for an insert: its commit's WAL
    /// flush); each one more makes batches smaller and costs Postgres a statement, a commit
    /// and a wake-up per smaller batch: two gave a quarter fewer new keys a second than one,
    /// four fewer still (bench/RESULTS.md).
    std::size_t max_in_flight = 1;
  };
  using Items = std::vector<std::shared_ptr<BatchItem>>;
  /// Sends `items` (at least one, no id twice) as one statement by `until`, the latest of their
  /// deadlines, and settles every one of them.
  using Send = std::function<boost::asio::awaitable<void>(const Items& items, Deadline until)>;

  StatementBatch(boost::asio::any_io_executor executor, Options options, Send send);
  ~StatementBatch();
  StatementBatch(const StatementBatch&) = delete;
  StatementBatch& operator=(const StatementBatch&) = delete;

  /// Queues `item` for the next batch and waits until it is settled (true) or its deadline has
  /// passed (false). A caller that stops waiting leaves the item abandoned.
  boost::asio::awaitable<bool> submit(std::shared_ptr<BatchItem> item);

  /// The io thread's executor the batch runs on (for the items' timers).
  const boost::asio::any_io_executor& executor() const noexcept;

  /// Statements sent so far, and the items they carried (for tests and the benchmark).
  std::uint64_t batches_sent() const noexcept;
  std::uint64_t items_sent() const noexcept;

  /// The queue and counters, shared with the batches in flight (defined in the .cpp).
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace idemgate::storage::pg
