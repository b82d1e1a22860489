#pragma once
// Deadlines of one io thread served by one timer: the header_read_timeout of slow request
// headers (SPEC C07, C54) and the renewal of in-flight locks (C18, C23). Ten thousand of them
// cost one armed timer, not ten thousand, and an entry added and removed before it is due costs
// no timer operation at all.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/intrusive/set.hpp>
#include <chrono>
#include <cstddef>

namespace idemgate::common {

/// The deadlines of one io thread, earliest first.
///
/// An Entry carries its deadline and what to do when it passes (`on_due`). Entries are
/// intrusive (no allocation): each lives with its owner (a coroutine frame, a connection), and a
/// Guard removes it on every exit. The timer is armed for the earliest deadline only, so it
/// fires once per moment at which something is due. A removed earliest entry leaves the timer
/// armed while other entries wait (it fires once more for nothing, which costs less than a
/// cancel and a re-arm per entry); the last one removed stops it, unless it is due within
/// kLinger (1 s).
/// Destroying the list unlinks the entries still in it; their Guards then leave it alone.
///
/// @par Thread safety
/// Not thread-safe: the executor's thread only (one instance per io thread).
class DeadlineList {
 public:
  using Clock = std::chrono::steady_clock;

  /// One deadline.
  struct Entry
      : boost::intrusive::set_base_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>> {
    Clock::time_point deadline;
    /// Called on the list's thread once `deadline` passed, the entry already removed: it may
    /// add itself again with a later deadline.
    void (*on_due)(Entry&) = nullptr;
    friend bool operator<(const Entry& a, const Entry& b) noexcept {
      return a.deadline < b.deadline;
    }
  };

  /// Adds `entry` for the scope of the guard and removes it at its end (unless it is gone).
  class Guard {
   public:
    Guard(DeadlineList& list, Entry& entry) : list_(list), entry_(entry) { list_.add(entry_); }
    ~Guard() {
      if (entry_.is_linked()) list_.remove(entry_);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    DeadlineList& list_;
    Entry& entry_;
  };

  explicit DeadlineList(boost::asio::any_io_executor executor);
  ~DeadlineList();
  DeadlineList(const DeadlineList&) = delete;
  DeadlineList& operator=(const DeadlineList&) = delete;

  /// Adds `entry` (its deadline and on_due set); arms the timer when it is the earliest.
  void add(Entry& entry);
  /// Removes `entry` if it is present.
  void remove(Entry& entry) noexcept;
  /// Entries waiting for their deadline.
  std::size_t size() const noexcept { return entries_.size(); }
  /// Entries whose deadline passed (on_due called), since the start.
  std::size_t expired() const noexcept { return expired_; }
  boost::asio::any_io_executor get_executor() { return timer_.get_executor(); }

 private:
  /// The last entry removed leaves a timer due within this armed (see remove()).
  static constexpr std::chrono::seconds kLinger{1};

  void arm(Clock::time_point when);
  void on_timer();

  boost::asio::steady_timer timer_;
  boost::intrusive::multiset<Entry> entries_;
  /// The deadline the timer waits for; time_point::max() when it does not wait.
  Clock::time_point armed_ = Clock::time_point::max();
  std::size_t expired_ = 0;
};

}  // namespace idemgate::common
