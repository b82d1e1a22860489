#include "gateway/core/idempotency_filter.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/core/replay_marker.hpp"

namespace idemgate::core {
namespace asio = boost::asio;

namespace {

using common::use_nothrow;

constexpr auto kCommitBackoffFirst = std::chrono::milliseconds(50);
constexpr auto kCommitBackoffMax = std::chrono::milliseconds(1000);

/// A pause drawn uniformly from [d/2, d].
std::chrono::milliseconds jittered(std::chrono::milliseconds d) {
  thread_local std::minstd_rand random{std::random_device{}()};
  std::uniform_int_distribution<std::chrono::milliseconds::rep> pick(d.count() / 2, d.count());
  return std::chrono::milliseconds(pick(random));
}

/// Whether the record of `response` keeps its body: not past max_stored_response (C29), nor when
/// the body was never held (C39: passed on to the client as it arrived).
bool stores_body(const StoredResponse& response, const RoutePolicy& policy) {
  return !response.body_omitted && response.body.size() <= policy.max_stored_response;
}

/// The record that stores `response` for `request`; its body is left out unless stores_body().
StoredRecord record_of(const KeyedRequest& request, const StoredResponse& response,
                       const RoutePolicy& policy) {
  StoredRecord record;
  record.id = request.id;
  record.route = request.route;
  record.fingerprint = request.fingerprint;
  record.response.status = response.status;
  record.response.headers = response.headers;
  if (stores_body(response, policy)) {
    record.response.body = response.body;
  } else {
    record.response.body_omitted = true;
  }
  return record;
}

/// Whether `stored` holds what `mine` would have stored: the same request and the same response.
bool same_record(const StoredRecord& stored, const StoredRecord& mine) {
  const auto& a = stored.response;
  const auto& b = mine.response;
  return stored.fingerprint == mine.fingerprint && a.status == b.status && a.headers == b.headers &&
         a.body == b.body && a.body_omitted == b.body_omitted;
}

/// The committed marker for a record whose stored form is `response` (C23): the response rides
/// along when it fits replay_cache_max_bytes. std::nullopt: markers are off for this route.
std::optional<std::string> marker_for(const RoutePolicy& policy, const Sha256& fingerprint,
                                      const StoredResponse& response) {
  if (policy.replay_cache_ttl <= std::chrono::milliseconds::zero()) return std::nullopt;
  const bool fits = replay_size(response) <= policy.replay_cache_max_bytes;
  return encode_replay_marker(fingerprint, fits ? &response : nullptr);
}

/// When a marker for a record expiring at `expires_at` must be gone: replay_cache_ttl from now,
/// but never past the record (C24: an expired record is absent at once). Postgres's clock sets
/// expires_at and Redis starts the marker's TTL when the command arrives, so the marker ends a
/// margin (a tenth of the record ttl, at most 1 s) before the record; clocks are assumed to
/// agree within it.
std::chrono::system_clock::time_point marker_end(const RoutePolicy& policy,
                                                 std::chrono::system_clock::time_point expires_at) {
  const auto margin = std::min<std::chrono::milliseconds>(policy.ttl / 10, std::chrono::seconds(1));
  return std::min(std::chrono::system_clock::now() + policy.replay_cache_ttl, expires_at - margin);
}

constexpr char kMismatchDetail[] =
    "this idempotency key was already used with a different request (method, target, headers or "
    "body); use a new key for a new request";

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor, d);
  co_await timer.async_wait(use_nothrow);
}

}  // namespace

/// A lock held by a request of this filter, renewed every lock_ttl/3 while the request runs
/// (C23). It lives in the request's frame: no allocation and no timer of its own. A renewal
/// sent holds `pending`, which points back here until the request ends, so that its answer
/// makes the entry due again only while there is one.
struct IdempotencyFilter::LockRenewal : common::DeadlineList::Entry {
  LockRenewal(IdempotencyFilter& owner, const Sha256& lock_id, const std::string& lock_token,
              std::chrono::milliseconds lock_ttl)
      : filter(owner),
        id(lock_id),
        token(lock_token),
        ttl(lock_ttl),
        every(std::max(lock_ttl / 3, std::chrono::milliseconds(1))) {
    on_due = [](common::DeadlineList::Entry& entry) {
      auto& renewal = static_cast<LockRenewal&>(entry);
      renewal.filter.renew_now(renewal);
    };
  }
  ~LockRenewal() {
    stop();
    if (pending) *pending = nullptr;
  }
  LockRenewal(const LockRenewal&) = delete;
  LockRenewal& operator=(const LockRenewal&) = delete;

  /// Makes it due `every` from now.
  void schedule(common::DeadlineList& renewals) {
    deadline = common::DeadlineList::Clock::now() + every;
    renewals.add(*this);
  }
  /// No renewal after this one (the upstream answered, or the request ends).
  void stop() noexcept {
    stopped = true;
    // Unlinked already when the list was destroyed first (a shutdown).
    if (is_linked()) filter.renewals_->remove(*this);
  }

  IdempotencyFilter& filter;
  const Sha256& id;
  const std::string& token;
  std::chrono::milliseconds ttl;
  std::chrono::milliseconds every;
  bool stopped = false;
  std::shared_ptr<LockRenewal*> pending;  ///< made by the first renewal sent
};

// Counts one waiting request for its record id while it lives.
class IdempotencyFilter::WaiterSlot {
 public:
  WaiterSlot(std::shared_ptr<WaiterCounts> counts, const Sha256& id)
      : counts_(std::move(counts)), id_(id) {
    ++(*counts_)[id_];
  }
  ~WaiterSlot() {
    const auto it = counts_->find(id_);
    if (it != counts_->end() && --it->second == 0) counts_->erase(it);
  }
  WaiterSlot(const WaiterSlot&) = delete;
  WaiterSlot& operator=(const WaiterSlot&) = delete;

 private:
  std::shared_ptr<WaiterCounts> counts_;
  Sha256 id_;
};

const char* outcome_label(Outcome outcome) {
  switch (outcome) {
    case Outcome::executed:
      return "executed";
    case Outcome::replayed:
      return "replayed";
    case Outcome::mismatch:
      return "mismatch";
    case Outcome::in_flight:
      return "in_flight";
    case Outcome::store_unavailable:
    case Outcome::unprotected:
      return "store_unavailable";
    case Outcome::upstream_error:
      return "upstream_error";
    case Outcome::not_stored:
      return "not_stored";
    case Outcome::shed:
      return "shed";
  }
  return "executed";
}

IdempotencyFilter::IdempotencyFilter(RecordStore& store, LockService& lock, FilterEvents events,
                                     std::shared_ptr<CommitBudget> budget)
    : store_(store), lock_(lock), events_(std::move(events)), budget_(std::move(budget)) {}

std::size_t IdempotencyFilter::waiters(const Sha256& id) const {
  const auto it = waiters_->find(id);
  return it == waiters_->end() ? 0 : it->second;
}

FilterResult IdempotencyFilter::from_record(const StoredRecord& record,
                                            const KeyedRequest& request) const {
  FilterResult result;
  if (record.fingerprint != request.fingerprint) {
    result.outcome = Outcome::mismatch;
    result.detail = kMismatchDetail;
    return result;
  }
  result.outcome = Outcome::replayed;
  result.response = record.response;
  return result;
}

asio::awaitable<FilterResult> IdempotencyFilter::on_store_error(const RoutePolicy& policy,
                                                                const char* what,
                                                                boost::system::error_code ec,
                                                                const Forward& forward) {
  if (events_.store_error) events_.store_error(what, ec);
  FilterResult result;
  if (!policy.fail_open) {
    result.outcome = Outcome::store_unavailable;
    result.detail = std::string("the idempotency store is unavailable (") + what + ": " +
                    ec.message() + "); the request was not forwarded, retry later";
    co_return result;
  }
  if (events_.forwarded_unprotected) events_.forwarded_unprotected();
  UpstreamReply reply = co_await forward();
  result.outcome =
      reply.kind == UpstreamReply::Kind::response ? Outcome::unprotected : Outcome::upstream_error;
  result.upstream_kind = reply.kind;
  result.response = std::move(reply.response);
  result.detail = std::move(reply.detail);
  co_return result;
}

void IdempotencyFilter::settle(const asio::any_io_executor& executor, const Sha256& id,
                               std::string token, std::optional<std::string> marker,
                               std::chrono::system_clock::time_point end) {
  ++settling_;
  // Detached: the client's answer does not wait, and its disconnect does not cancel it (C34).
  // Until this lands, a retry meets the lock and looks the record up (C15), so it is a replay.
  asio::co_spawn(
      executor,
      [this, id, token = std::move(token), marker = std::move(marker),
       end]() mutable -> asio::awaitable<void> {
        // The TTL is taken when the command leaves, not when the answer did.
        const auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(
            end - std::chrono::system_clock::now());
        if (ttl < std::chrono::milliseconds(1)) marker.reset();  // no time left: just release
        if (marker) {
          auto replaced = co_await lock_.replace(id, token, std::move(*marker), ttl);
          if (replaced) co_return;
          if (events_.store_error) events_.store_error("lock replace", replaced.error());
          // The replace may never have reached Redis (it timed out queued behind a reconnect):
          // the lock would then hold retries off as in-flight conflicts or Postgres lookups
          // until lock_ttl (C25). Released by compare-and-delete, a marker that did land stays.
          auto released = co_await lock_.release(id, std::move(token));
          if (!released && events_.store_error)
            events_.store_error("lock release", released.error());
        } else {
          auto released = co_await lock_.release(id, std::move(token));
          if (!released && events_.store_error)
            events_.store_error("lock release", released.error());
        }
      },
      [this](std::exception_ptr e) {
        if (--settling_ == 0 && on_settled_) std::exchange(on_settled_, nullptr)();
        task_ended("lock settle", e);
      });
}

void IdempotencyFilter::renew_now(LockRenewal& renewal) {
  if (!renewal.pending) renewal.pending = std::make_shared<LockRenewal*>(&renewal);
  // Nothing may escape into the io thread from this detached task: an exception (from a lock
  // implementation, an allocation) stops this renewal only, reported through task_failed.
  asio::co_spawn(
      renewals_->get_executor(),
      [this, id = renewal.id, token = renewal.token, ttl = renewal.ttl,
       pending = renewal.pending]() -> asio::awaitable<void> {
        auto renewed = co_await lock_.renew(id, token, ttl);
        if (!renewed && events_.store_error) events_.store_error("lock renew", renewed.error());
        LockRenewal* again = *pending;
        if (again != nullptr && !again->stopped && renewals_) again->schedule(*renewals_);
      },
      [this](std::exception_ptr e) { task_ended("lock renew", e); });
}

void IdempotencyFilter::task_ended(const char* what, const std::exception_ptr& e) {
  if (!e) return;
  if (events_.task_failed) events_.task_failed(what, common::exception_text(e));
}

void IdempotencyFilter::when_settled(std::function<void()> done) {
  if (settling_ == 0) {
    done();
    return;
  }
  on_settled_ = std::move(done);
}

// Every named local of a coroutine has its own slot in its frame (GCC 12 does not share slots
// between scopes), and Asio recycles frames only up to 1020 bytes: a larger one is a fresh heap
// block per request, and a block that size sends glibc's malloc through its slow path for the
// allocations after it. So run() keeps one answer, and the steps that need a record lookup
// run in frames of their own.
asio::awaitable<FilterResult> IdempotencyFilter::run(const RoutePolicy& policy,
                                                     KeyedRequest request, Forward forward) {
  const std::string token = random_token();
  const auto deadline = std::chrono::steady_clock::now() + policy.wait_timeout;
  auto backoff = std::chrono::milliseconds(5);
  std::optional<WaiterSlot> waiting;  // held from the first wait until this request ends
  int stale_markers = 0;
  FilterResult answer;  // filled by the step that ends the request
  for (;;) {
    // C54: a place in the commit queue before the lock, kept through the commit when this
    // attempt executes, given back at the end of the iteration when it does not.
    CommitBudget::Place place;
    if (budget_) {
      place = budget_->try_take();
      if (!place) {
        answer.outcome = Outcome::shed;
        answer.detail = "the gateway has " + std::to_string(budget_->max_pending()) +
                        " records waiting for their commit (storage.postgres.max_pending); the "
                        "request was not forwarded, retry later";
        co_return std::move(answer);
      }
    }
    // One round trip: the lock is ours, or we learn what holds the key.
    auto acquired = co_await lock_.acquire(request.id, token, policy.lock_ttl);
    if (!acquired) {
      co_await without_lock(policy, request, acquired.error(), forward, answer);
      co_return std::move(answer);
    }
    if (acquired->acquired) {
      waiting.reset();  // no longer a waiter: it executes
      co_await execute_locked(policy, request, token, forward, answer);
      co_return std::move(answer);
    }
    // Committed (C23): the marker alone answers when it carries the response.
    if (is_replay_marker(acquired->holder) &&
        answered_by_marker(acquired->holder, request, answer)) {
      co_return std::move(answer);
    }
    const Step step = co_await held_by(policy, request, std::move(acquired->holder), forward,
                                       stale_markers, answer);
    if (step == Step::answered) co_return std::move(answer);
    if (step == Step::compete_again) continue;

    place.release();  // not executing: a waiter holds no place while it waits
    if (!policy.wait_for_in_flight || std::chrono::steady_clock::now() >= deadline) {
      answer.outcome = Outcome::in_flight;
      answer.detail =
          "a request with this idempotency key is still being processed; retry after it "
          "completes";
      co_return std::move(answer);
    }
    if (!waiting) {
      // Coalescing is bounded: every waiter holds a client connection and polls the stores.
      if (waiters(request.id) >= policy.max_waiters) {
        answer.outcome = Outcome::in_flight;
        answer.detail =
            "a request with this idempotency key is still being processed and too many others "
            "are already waiting for it; retry after it completes";
        co_return std::move(answer);
      }
      waiting.emplace(waiters_, request.id);
    }
    // concurrency: wait — poll until the first request's marker or record appears or its lock is
    // freed (then compete for it like a new request), bounded by wait_timeout (C18).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    co_await sleep_for(std::min(backoff, std::max(left, std::chrono::milliseconds(1))));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

bool IdempotencyFilter::answered_by_marker(std::string_view holder, const KeyedRequest& request,
                                           FilterResult& answer) {
  // The marker is written only after its record committed, and carries the record's
  // fingerprint and, when small, its stored response.
  auto marker = decode_replay_marker(holder);
  if (marker && marker->fingerprint != request.fingerprint) {
    answer.outcome = Outcome::mismatch;
    answer.detail = kMismatchDetail;
    answer.from_marker = true;
    return true;
  }
  if (marker && marker->response) {
    answer.outcome = Outcome::replayed;
    answer.response = std::move(*marker->response);
    answer.from_marker = true;
    return true;
  }
  return false;
}

asio::awaitable<IdempotencyFilter::Step> IdempotencyFilter::held_by(
    const RoutePolicy& policy, const KeyedRequest& request, std::string holder,
    const Forward& forward, int& stale_markers, FilterResult& answer) {
  const bool marker = is_replay_marker(holder);
  // A marker without the response: the record has it. A lock: the holder may have committed
  // and answered without having replaced its lock yet (C15), so the record decides before any
  // 409.
  auto found = co_await store_.find(request.id);
  if (!found) {
    answer = co_await on_store_error(policy, "record lookup", found.error(), forward);
    co_return Step::answered;
  }
  if (*found) {
    answer = from_record(**found, request);
    co_return Step::answered;
  }
  if (marker) {
    // The record is gone (purged, or expired early) while its marker lived: drop that marker
    // (only if it is still the value) and compete for the key again.
    co_await lock_.release(request.id, std::move(holder));
    co_return ++stale_markers <= 2 ? Step::compete_again : Step::held;
  }
  if (events_.lock_contention) events_.lock_contention();  // still executing elsewhere
  co_return Step::held;
}

asio::awaitable<void> IdempotencyFilter::without_lock(const RoutePolicy& policy,
                                                      const KeyedRequest& request,
                                                      boost::system::error_code ec,
                                                      const Forward& forward,
                                                      FilterResult& answer) {
  // The lock store failed; a committed record in Postgres can still answer.
  auto found = co_await store_.find(request.id);
  if (found && *found) {
    if (events_.store_error) events_.store_error("lock acquire", ec);
    answer = from_record(**found, request);
    co_return;
  }
  answer = co_await on_store_error(policy, "lock acquire", ec, forward);
}

asio::awaitable<boost::system::result<InsertResult>> IdempotencyFilter::commit(
    const RoutePolicy& policy, const KeyedRequest& request, const StoredResponse& response) {
  // C26: the insert is idempotent (ON CONFLICT), and the store sends each attempt on a fresh
  // connection after a failure, so a retry after a failover reaches the new primary.
  const auto deadline = std::chrono::steady_clock::now() + policy.commit_timeout;
  auto backoff = kCommitBackoffFirst;
  bool failed_before = false;
  for (;;) {
    // Built per attempt: the store takes its record by value, and the retries need the response.
    auto inserted = co_await store_.insert(record_of(request, response, policy), policy.ttl);
    if (inserted && !inserted->inserted && inserted->existing && failed_before &&
        same_record(*inserted->existing, record_of(request, response, policy))) {
      // An attempt reported as failed had committed (the connection broke before its answer
      // came back): the row found is this request's own, not another execution's (C36).
      co_return InsertResult{true, std::nullopt};
    }
    if (inserted) co_return inserted;
    failed_before = true;
    if (events_.store_error) events_.store_error("record commit", inserted.error());
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) co_return inserted;
    // Full jitter in [backoff/2, backoff]: gateways cut off by the same failover do not all
    // come back in step.
    const auto pause = std::min(
        jittered(backoff), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    co_await sleep_for(std::max(pause, std::chrono::milliseconds(1)));
    backoff = std::min(backoff * 2, kCommitBackoffMax);
  }
}

asio::awaitable<void> IdempotencyFilter::execute_locked(const RoutePolicy& policy,
                                                        const KeyedRequest& request,
                                                        const std::string& token,
                                                        const Forward& forward,
                                                        FilterResult& answer) {
  const auto executor = co_await asio::this_coro::executor;
  // The record may be older than any marker (the marker expired first, or Redis lost it).
  auto found = co_await store_.find(request.id);
  if (!found) {
    co_await lock_.release(request.id, token);
    answer = co_await on_store_error(policy, "record lookup", found.error(), forward);
    co_return;
  }
  if (*found) {
    // Put the marker back, so the retries after this one skip Postgres again.
    const StoredRecord& record = **found;
    settle(executor, request.id, token, marker_for(policy, record.fingerprint, record.response),
           marker_end(policy, record.expires_at));
    answer = from_record(record, request);
    co_return;
  }

  // Renewal lasts through the upstream call and the commit (C26 retries included), and ends
  // before the lock is released or left to expire; also when forward() or the store throws.
  if (!renewals_) renewals_ = std::make_unique<common::DeadlineList>(executor);
  LockRenewal renewal(*this, request.id, token, policy.lock_ttl);
  renewal.schedule(*renewals_);
  const auto started = std::chrono::steady_clock::now();
  UpstreamReply reply = co_await forward();
  const auto upstream_time = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - started);

  answer.upstream_time = upstream_time;
  if (reply.kind != UpstreamReply::Kind::response) {
    renewal.stop();
    answer.outcome = Outcome::upstream_error;
    answer.upstream_kind = reply.kind;
    answer.detail = std::move(reply.detail);
    // Not reached: nothing executed, free the key. Unknown outcome: the upstream may have
    // executed; hold the lock until lock_ttl so quick retries get 409 (C22).
    if (reply.kind == UpstreamReply::Kind::not_reached || !policy.hold_on_unknown_outcome) {
      co_await lock_.release(request.id, token);
    }
    co_return;
  }

  if (!policy.store_statuses.contains(reply.response.status)) {
    renewal.stop();
    co_await lock_.release(request.id, token);
    answer.outcome = Outcome::not_stored;
    answer.response = std::move(reply.response);
    co_return;
  }

  answer.response = std::move(reply.response);
  // The record expires ttl after its insert starts, by Postgres's clock: no earlier than this.
  const auto earliest_expiry = std::chrono::system_clock::now() + policy.ttl;
  auto inserted = co_await commit(policy, request, answer.response);
  renewal.stop();
  if (!inserted) {
    // C26: the upstream executed; the client gets its answer, the lock stays until lock_ttl so
    // quick retries get 409 rather than a second execution.
    answer.outcome = Outcome::executed;
    answer.record_commit_failed = true;
    if (events_.record_commit_failed) events_.record_commit_failed();
    co_return;
  }
  if (!inserted->inserted && inserted->existing) {
    // C36: the lock was lost and another execution committed first; its answer is the one.
    if (events_.duplicate_execution) events_.duplicate_execution();
    const StoredRecord& winner = *inserted->existing;
    settle(executor, request.id, token, marker_for(policy, winner.fingerprint, winner.response),
           marker_end(policy, winner.expires_at));
    answer = from_record(winner, request);
    answer.duplicate_execution = true;
    answer.upstream_time = upstream_time;
    co_return;
  }
  // The marker carries the record's stored form: without the body unless stores_body().
  std::optional<std::string> marker;
  if (!stores_body(answer.response, policy)) {
    StoredResponse stored{answer.response.status, answer.response.headers, {}, true};
    marker = marker_for(policy, request.fingerprint, stored);
  } else {
    marker = marker_for(policy, request.fingerprint, answer.response);
  }
  settle(executor, request.id, token, std::move(marker), marker_end(policy, earliest_expiry));
  answer.outcome = Outcome::executed;
  co_return;
}

}  // namespace idemgate::core
