#pragma once
// Load shedding's counts (SPEC C52, C53): requests in progress per route, bounded by the route's
// `max_in_flight`, and tunnels open, bounded by `limits.max_tunnels`. Process-wide: the io
// threads share them, and they outlive configuration reloads (a route keeps its count by name).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "gateway/http/settings.hpp"

namespace idemgate::http {

/// Counts of what a load-shedding limit bounds.
///
/// @par Thread safety
/// Every member is thread-safe. A request's enter() is one atomic operation once its thread has
/// looked the route up (a per-thread cache; the first lookup of a route name on a thread takes
/// a mutex).
class Admission {
 public:
  /// One unit of a count, held while the request (or tunnel) is in progress; an empty ticket
  /// means the limit was reached. Move-only; destroying a non-empty ticket gives the unit back,
  /// on any thread.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept
        : count_(std::exchange(other.count_, nullptr)), held_(other.held_) {}
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();

    /// False when the limit was reached (the request is to be shed).
    explicit operator bool() const noexcept { return held_; }

   private:
    friend class Admission;
    Ticket(std::atomic<std::size_t>* count, bool held) : count_(count), held_(held) {}
    std::atomic<std::size_t>* count_ = nullptr;  ///< decremented on destruction when set
    bool held_ = false;
  };

  Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  /// A ticket for one request of `route` (SPEC C53): empty when `route.max_in_flight` requests
  /// of a route of that name are in progress. A route without `max_in_flight` always gets a
  /// (non-empty) ticket that counts nothing.
  Ticket enter(const Route& route);

  /// A ticket for one tunnel (SPEC C52): empty when `max_tunnels` are open.
  Ticket open_tunnel(std::size_t max_tunnels);

  /// Requests of the route named `route` in progress now (counted only while it has
  /// max_in_flight). For tests and metrics.
  std::size_t in_flight(std::string_view route) const;
  /// Tunnels open (or being opened) now.
  std::size_t tunnels() const noexcept { return tunnels_.load(std::memory_order_relaxed); }

 private:
  using Counts = std::map<std::string, std::unique_ptr<std::atomic<std::size_t>>, std::less<>>;
  std::atomic<std::size_t>& count_of(std::string_view route);
  static Ticket take(std::atomic<std::size_t>& count, std::size_t max);

  const std::uint64_t id_;  ///< per instance: a thread's cache never outlives its owner
  mutable std::mutex mutex_;
  Counts counts_;  ///< never shrinks: addresses stay valid for the cache and the tickets
  std::atomic<std::size_t> tunnels_{0};
};

}  // namespace idemgate::http
