#pragma once
// The bound on the record commit queue (SPEC C54, `storage.postgres.max_pending`): every keyed
// request that may execute takes a place before its lock and keeps it until its record is
// committed (or it ends without one), so a request that executed always has its place, and a
// stalled Postgres stops new executions instead of growing the queue.

#include <atomic>
#include <cstddef>
#include <utility>

namespace idemgate::core {

/// Places in the commit queue, shared by the filters of every io thread.
///
/// @par Thread safety
/// Every member is thread-safe and lock-free (one atomic operation); a Place may be given back
/// on any thread.
class CommitBudget {
 public:
  /// One place, held while its request may still need a commit. Move-only; empty when the
  /// budget was exhausted (or moved from).
  class Place {
   public:
    Place() = default;
    Place(Place&& other) noexcept : budget_(std::exchange(other.budget_, nullptr)) {}
    Place& operator=(Place&& other) noexcept {
      if (this != &other) {
        release();
        budget_ = std::exchange(other.budget_, nullptr);
      }
      return *this;
    }
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;
    ~Place() { release(); }

    explicit operator bool() const noexcept { return budget_ != nullptr; }
    /// Gives the place back now (idempotent).
    void release() noexcept {
      if (budget_) std::exchange(budget_, nullptr)->pending_.fetch_sub(1);
    }

   private:
    friend class CommitBudget;
    explicit Place(CommitBudget* budget) : budget_(budget) {}
    CommitBudget* budget_ = nullptr;
  };

  /// `max_pending` ≥ 1 places.
  explicit CommitBudget(std::size_t max_pending) : max_(max_pending) {}
  CommitBudget(const CommitBudget&) = delete;
  CommitBudget& operator=(const CommitBudget&) = delete;

  /// A place, or an empty one when max_pending are taken.
  Place try_take() noexcept {
    std::size_t now = pending_.load();
    while (now < max_) {
      if (pending_.compare_exchange_weak(now, now + 1)) return Place(this);
    }
    return Place();
  }

  /// Places taken now (`idemgate_pending_commits`).
  std::size_t pending() const noexcept { return pending_.load(std::memory_order_relaxed); }
  std::size_t max_pending() const noexcept { return max_; }

 private:
  const std::size_t max_;
  std::atomic<std::size_t> pending_{0};
};

}  // namespace idemgate::core
