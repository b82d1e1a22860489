#pragma once
// The process-wide bound on client connections (SPEC C52): every io thread's acceptor takes a
// slot before it accepts and pauses while there is none, so that new connections wait in the
// listen backlog and the descriptors the connections already open need (upstream and store
// connections) are never taken by new ones. Accept errors for lack of descriptors (EMFILE,
// ENFILE) pause an acceptor the same way instead of making it retry at once.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::http {

/// Slots for client connections, shared by the acceptors of every io thread, and the record of
/// their pauses.
///
/// An acceptor takes a slot (try_take) before each accept and hands it to the connection it
/// accepts, which gives it back when it closes (give_back). An acceptor that finds no slot, or
/// whose accept failed for lack of descriptors, parks: it stops accepting until give_back()
/// wakes it (a connection closed), or until it unparks itself (a timer of its own). While at
/// least one acceptor is parked the gateway counts as paused (paused_seconds).
///
/// @par Thread safety
/// Every member is thread-safe. try_take/give_back are one atomic operation each (no lock on
/// the request path); parking and waking take a mutex, only while an acceptor is paused.
class ConnectionGate {
 public:
  /// Wakes a parked acceptor: called once, on the thread that freed a slot, and must only post
  /// to the acceptor's own thread.
  using Wake = std::function<void()>;

  /// `max_connections` 0: no bound (slots are still counted). `listener` names it in the log
  /// ("listen", "admin").
  explicit ConnectionGate(std::size_t max_connections, std::string listener = "listen");
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  /// Takes a slot; false when max_connections are taken.
  bool try_take() noexcept;
  /// Frees a slot, and wakes every parked acceptor.
  void give_back();

  /// Parks the acceptor `id` with `wake` unless a slot can be taken now: true when a slot was
  /// taken (the acceptor is not parked). Taking and parking are one step, so a slot freed
  /// meanwhile is never missed.
  bool take_or_park(const void* id, Wake wake);
  /// Parks the acceptor `id` with `wake` without taking a slot (its accept failed for lack of
  /// descriptors: the next close frees one).
  void park(const void* id, Wake wake);
  /// Ends the acceptor's parking if it is still parked (it woke up by its own timer, or stops).
  void unpark(const void* id);

  /// Counts one pause of an acceptor and logs `accept paused` (warning) at most once a second
  /// (SPEC C52), with the `listener`, the pauses since the previous line (`count`), the last
  /// one's `reason` ("max_connections", or the accept error), the slots taken and the limit.
  void note_pause(std::string_view reason);

  /// Slots taken now: connections open plus accepts in progress.
  std::size_t taken() const noexcept { return taken_.load(std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return max_; }
  /// Seconds during which at least one acceptor was parked, since the gate was made
  /// (`idemgate_accept_paused_seconds_total`).
  double paused_seconds() const;

 private:
  struct Parked {
    const void* id;
    Wake wake;
  };
  void park_locked(const void* id, Wake wake);
  void settle_pause_locked(std::chrono::steady_clock::time_point now);

  const std::size_t max_;
  const std::string listener_;
  std::atomic<std::size_t> taken_{0};
  std::atomic<std::size_t> parked_count_{0};

  mutable std::mutex mutex_;
  std::vector<Parked> parked_;
  std::chrono::steady_clock::time_point paused_since_{};
  std::chrono::steady_clock::duration paused_total_{};

  std::mutex log_mutex_;
  std::chrono::steady_clock::time_point last_line_{};
  bool logged_ = false;
  std::uint64_t unreported_ = 0;
};

}  // namespace idemgate::http
