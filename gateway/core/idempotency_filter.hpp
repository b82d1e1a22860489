#pragma once
// The idempotency state machine (SPEC C15–C26, C36), network-free: it sequences the durable
// store, the in-flight lock and the upstream call behind three seams, so it runs against
// in-memory fakes in unit tests and against Postgres/Redis in production.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "gateway/common/deadline_list.hpp"
#include "gateway/core/commit_budget.hpp"
#include "gateway/core/lock_service.hpp"
#include "gateway/core/record_store.hpp"
#include "gateway/core/status_set.hpp"
#include "gateway/core/stored_response.hpp"

namespace idemgate::core {

/// The per-route rules the filter applies (from `routes[].idempotency`, SPEC §2).
struct RoutePolicy {
  std::chrono::milliseconds ttl{std::chrono::hours(24)};         ///< record retention
  std::chrono::milliseconds lock_ttl{std::chrono::seconds(30)};  ///< renewed every lock_ttl/3
  bool wait_for_in_flight = false;  ///< concurrency: wait (C18) instead of reject
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(10)};
  /// concurrency: wait — requests of one filter (one gateway thread) that may wait for the same
  /// record id at once; the next one gets Outcome::in_flight without waiting (C18). 0: never
  /// wait.
  std::size_t max_waiters = 32;
  StatusSet store_statuses = StatusSet::default_storable();  ///< C21
  std::size_t max_stored_response = 8 * 1024 * 1024;         ///< bytes of body (C29)
  bool hold_on_unknown_outcome = true;                       ///< on_unknown_outcome: hold (C22)
  bool fail_open = false;                                    ///< on_store_error: fail_open (C25)
  /// How long a failed record commit is retried after the upstream answered (C26,
  /// `idempotency.commit_timeout`); 0: one attempt only.
  std::chrono::milliseconds commit_timeout{std::chrono::seconds(10)};
  /// How long the committed marker that replaces the lock lives (C23,
  /// `idempotency.replay_cache_ttl`); never past the record's expiry. 0: no marker, the lock is
  /// deleted.
  std::chrono::milliseconds replay_cache_ttl{std::chrono::minutes(5)};
  /// Stored responses up to this many bytes (header names and values plus body) travel in the
  /// marker and replay without a Postgres lookup (`idempotency.replay_cache_max_bytes`).
  std::size_t replay_cache_max_bytes = 16 * 1024;
};

/// What the upstream exchange ended with, as the filter needs it.
struct UpstreamReply {
  enum class Kind { response, not_reached, unknown_outcome, timed_out };
  Kind kind = Kind::not_reached;
  /// Kind::response: end-to-end fields and the whole body; or, with `body_omitted`, a response
  /// whose body was not held but passed on to the client (C39): stored without body.
  StoredResponse response;
  std::string detail;
};

/// How the filter ended (the SPEC C31 outcome label is outcome_label()).
enum class Outcome {
  executed,           ///< forwarded once, record committed (or commit failed: C26)
  replayed,           ///< stored response returned, upstream not called (C16, C36)
  mismatch,           ///< same key, different fingerprint (C17)
  in_flight,          ///< same key still executing (C18 reject, or wait timed out)
  store_unavailable,  ///< a store failed; fail_closed → 503 (C25)
  unprotected,        ///< a store failed; fail_open → forwarded without dedup (C25)
  upstream_error,     ///< the upstream gave no response (C21 not reached, C22 unknown)
  not_stored,         ///< the upstream answered with a status outside store_statuses (C21)
  /// the commit queue was full (CommitBudget, C54): nothing forwarded, no lock, no record
  shed,
};

/// The SPEC C31 `outcome` label (unprotected counts as store_unavailable).
const char* outcome_label(Outcome outcome);

/// The filter's decision: what to send back.
struct FilterResult {
  Outcome outcome = Outcome::executed;
  /// executed / not_stored / unprotected / replayed: the response to send (for a replay, the
  /// stored one; body_omitted marks a C29 replay without body).
  StoredResponse response;
  UpstreamReply::Kind upstream_kind = UpstreamReply::Kind::response;  ///< upstream_error only
  std::string detail;                 ///< problem details text for error outcomes
  bool record_commit_failed = false;  ///< C26: executed but the record could not be stored
  bool duplicate_execution = false;   ///< C36: executed, but another record had won
  std::chrono::microseconds upstream_time{0};
  bool from_marker = false;  ///< replayed / mismatch: decided from the lock store's marker alone
};

/// Identity of a keyed request.
struct KeyedRequest {
  Sha256 id{};           ///< record_id(scope, key)
  Sha256 fingerprint{};  ///< compute_fingerprint(...)
  std::string route;     ///< route name, stored with the record
};

/// Counters the filter raises; observers for metrics and tests. All optional.
struct FilterEvents {
  std::function<void()> lock_contention;       ///< someone else held the lock (C18)
  std::function<void()> duplicate_execution;   ///< insert found an existing record (C36)
  std::function<void()> record_commit_failed;  ///< C26
  std::function<void(const char* what, const boost::system::error_code&)> store_error;
  /// A background task of the filter (what: "lock renew") ended with an exception; the task is
  /// stopped, the request it served goes on.
  std::function<void(const char* what, const std::string& detail)> task_failed;
  /// A request was forwarded without deduplication (fail_open, C25), whatever it got back:
  /// readiness says `degraded` for a while (C58).
  std::function<void()> forwarded_unprotected;
};

/// Runs one keyed request through the contract. One instance per io thread (its store and lock
/// are that thread's); not thread-safe.
///
/// Sequence (SPEC C15–C26, C36): one lock store round trip takes the lock with a fresh owner
/// token or returns what holds the key.
/// - A committed marker (core/replay_marker.hpp) answers at once: mismatch, or the replay it
///   carries; a marker without the response sends the request to the record in Postgres (a
///   marker whose record is gone is dropped and the key competed for again).
/// - Another owner's token: look the record up (its owner may have committed and answered but
///   not yet replaced its lock), then 409, or wait and poll (at most RoutePolicy::max_waiters
///   requests per record id at a time).
/// - Taken: look the record up (it may be older than any marker), forward while renewing the
///   lock every lock_ttl/3, commit the record with INSERT … ON CONFLICT before the response
///   leaves (a failed commit is retried with jittered backoff, 50 ms doubling to 1 s, the lock
///   still renewed, until it commits or RoutePolicy::commit_timeout passes: C26). The lock is then
///   replaced by the committed marker (or deleted when replay_cache_ttl is 0) in the background:
///   the answer does not wait for it. Upstream failures and unstored statuses release the lock
///   before the answer (C21, C22).
/// - The lock store failing: a committed record in Postgres still answers; otherwise
///   on_store_error (C25).
/// The upstream call, the commit and the marker are never cancelled by the caller's stop of
/// waiting: the filter is meant to be co_spawned detached from the client (C34).
///
/// With a CommitBudget (C54), each attempt at the lock first takes a place in the commit queue,
/// kept until the request's record is committed (C26 retries included) or it ends without one;
/// with none left, the request ends with Outcome::shed before any store is asked. A place
/// taken for an attempt that finds the key held is given back before the request waits.
class IdempotencyFilter {
 public:
  using Forward = std::function<boost::asio::awaitable<UpstreamReply>()>;

  /// `budget` may be null (no bound); it may be shared with the filters of other threads.
  IdempotencyFilter(RecordStore& store, LockService& lock, FilterEvents events = {},
                    std::shared_ptr<CommitBudget> budget = nullptr);

  /// `policy` is read until the returned awaitable completes, so it must outlive that: the
  /// handler keeps it in the shared state its `forward` holds, so it lives as long as the run
  /// (C34) even when the caller goes away.
  boost::asio::awaitable<FilterResult> run(const RoutePolicy& policy, KeyedRequest request,
                                           Forward forward);
  /// A temporary policy would be gone before the run reads it.
  boost::asio::awaitable<FilterResult> run(RoutePolicy&& policy, KeyedRequest request,
                                           Forward forward) = delete;

  /// How many requests of this filter are waiting for record `id` now (C18 wait mode).
  std::size_t waiters(const Sha256& id) const;

  /// Lock settlements (marker writes, releases) still running in the background.
  std::size_t settling() const noexcept { return settling_; }
  /// Calls `done` once no settlement runs (at once when none does); for a graceful stop.
  void when_settled(std::function<void()> done);

 private:
  /// Waiting requests by record id; an entry exists only while its count is above zero. Shared
  /// with the waiters' slots, so that a coroutine frame destroyed after the filter stays safe.
  using WaiterCounts = std::map<Sha256, std::size_t>;
  class WaiterSlot;
  /// One held lock's renewal (C23): an entry of renewals_, due every lock_ttl/3.
  struct LockRenewal;

  /// What an attempt at the key ended with, in run()'s loop.
  enum class Step { answered, compete_again, held };
  /// The committed marker `holder` answers (mismatch, or the replay of the response it
  /// carries, C23): fills `answer`. False when the marker has no response or does not decode.
  static bool answered_by_marker(std::string_view holder, const KeyedRequest& request,
                                 FilterResult& answer);
  /// The key is held by `holder` (a marker without its response, or another request's lock):
  /// the record answers if it exists (C15); a marker whose record is gone is dropped and the key
  /// competed for again (twice at most); otherwise the key is still held elsewhere.
  boost::asio::awaitable<Step> held_by(const RoutePolicy& policy, const KeyedRequest& request,
                                       std::string holder, const Forward& forward,
                                       int& stale_markers, FilterResult& answer);
  /// The lock store failed: a committed record still answers, otherwise on_store_error (C25).
  boost::asio::awaitable<void> without_lock(const RoutePolicy& policy, const KeyedRequest& request,
                                            boost::system::error_code ec, const Forward& forward,
                                            FilterResult& answer);
  /// The lock is this request's: the record decides, else the upstream executes and its
  /// answer is committed (C20–C26, C36); fills `answer`.
  boost::asio::awaitable<void> execute_locked(const RoutePolicy& policy,
                                              const KeyedRequest& request, const std::string& token,
                                              const Forward& forward, FilterResult& answer);
  /// Inserts the record of `response` for `request`, retrying a failure until
  /// policy.commit_timeout (C26).
  boost::asio::awaitable<boost::system::result<InsertResult>> commit(
      const RoutePolicy& policy, const KeyedRequest& request, const StoredResponse& response);
  boost::asio::awaitable<FilterResult> on_store_error(const RoutePolicy& policy, const char* what,
                                                      boost::system::error_code ec,
                                                      const Forward& forward);
  FilterResult from_record(const StoredRecord& record, const KeyedRequest& request) const;
  /// Ends this request's hold of the lock in the background: replaced by `marker` until `end`
  /// (the TTL is computed when the command is sent), or deleted when there is no marker or no
  /// time left for it.
  void settle(const boost::asio::any_io_executor& executor, const Sha256& id, std::string token,
              std::optional<std::string> marker, std::chrono::system_clock::time_point end);
  /// Sends the renewal of `renewal`'s lock; once answered, it is due again (while its request
  /// runs and the renewal did not throw).
  void renew_now(LockRenewal& renewal);
  /// The end of a detached task (`what`: "lock renew", "lock settle"): an exception stops the
  /// task only and is reported through FilterEvents::task_failed.
  void task_ended(const char* what, const std::exception_ptr& e);

  RecordStore& store_;
  LockService& lock_;
  FilterEvents events_;
  std::shared_ptr<CommitBudget> budget_;
  std::shared_ptr<WaiterCounts> waiters_ = std::make_shared<WaiterCounts>();
  std::size_t settling_ = 0;
  std::function<void()> on_settled_;
  /// The renewals of the locks this filter's requests hold: one timer for all of them, made on
  /// first use with the executor of the filter's thread.
  std::unique_ptr<common::DeadlineList> renewals_;
};

}  // namespace idemgate::core
