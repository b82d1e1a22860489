#pragma once
// The header_read_timeout of the client connections of one io thread that read their request
// header in more than one piece (SPEC C07, C54). One timer per thread serves them all, so a slow
// connection costs no timer operation per byte it sends, and ten thousand of them do not fill
// the timer queue that every other request of the thread uses.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/intrusive/set.hpp>
#include <chrono>
#include <cstddef>

namespace idemgate::http {

/// The deadlines of one io thread's slow request headers, earliest first.
///
/// A connection whose header did not arrive in its first read adds an Entry with the moment its
/// header_read_timeout runs out; when that moment passes before the entry is removed, its socket
/// is closed, which ends the reads waiting on it (`operation_aborted`). Entries are intrusive
/// (no allocation): each lives in the waiting coroutine's frame, and Guard removes it on every
/// exit. The timer is armed for the earliest deadline only, so it fires once per moment at which
/// connections must be cut, never per byte read.
///
/// @par Thread safety
/// Not thread-safe: the executor's thread only (one instance per io thread).
class HeaderDeadlines {
 public:
  using Clock = std::chrono::steady_clock;

  /// One connection's deadline.
  struct Entry
      : boost::intrusive::set_base_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>> {
    Clock::time_point deadline;
    boost::asio::ip::tcp::socket* socket = nullptr;
    friend bool operator<(const Entry& a, const Entry& b) noexcept {
      return a.deadline < b.deadline;
    }
  };

  /// Adds `entry` for the scope of the guard and removes it at its end.
  class Guard {
   public:
    Guard(HeaderDeadlines& deadlines, Entry& entry) : deadlines_(deadlines), entry_(entry) {
      deadlines_.add(entry_);
    }
    ~Guard() { deadlines_.remove(entry_); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    HeaderDeadlines& deadlines_;
    Entry& entry_;
  };

  explicit HeaderDeadlines(boost::asio::any_io_executor executor);
  ~HeaderDeadlines();
  HeaderDeadlines(const HeaderDeadlines&) = delete;
  HeaderDeadlines& operator=(const HeaderDeadlines&) = delete;

  /// Adds `entry` (its deadline and socket set); arms the timer when it is the earliest.
  void add(Entry& entry);
  /// Removes `entry` if it is present (the header arrived, or the connection ended).
  void remove(Entry& entry) noexcept;
  /// Connections waiting for the rest of their header.
  std::size_t size() const noexcept { return entries_.size(); }
  /// Connections closed because their deadline passed, since the start.
  std::size_t expired() const noexcept { return expired_; }

 private:
  void arm(Clock::time_point when);
  void on_timer();

  boost::asio::steady_timer timer_;
  boost::intrusive::multiset<Entry> entries_;
  /// The deadline the timer waits for; time_point::max() when it does not wait.
  Clock::time_point armed_ = Clock::time_point::max();
  std::size_t expired_ = 0;
};

}  // namespace idemgate::http
