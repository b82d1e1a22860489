#include "gateway/http/connection_gate.hpp"

#include <algorithm>
#include <boost/json/object.hpp>
#include <utility>

#include "gateway/common/json_log.hpp"

namespace idemgate::http {

using Clock = std::chrono::steady_clock;
using common::format_rfc3339;
using common::log_json;

ConnectionGate::ConnectionGate(std::size_t max_connections, std::string listener)
    : max_(max_connections), listener_(std::move(listener)) {}

bool ConnectionGate::try_take() noexcept {
  if (max_ == 0) {
    taken_.fetch_add(1);
    return true;
  }
  std::size_t now = taken_.load();
  while (now < max_) {
    if (taken_.compare_exchange_weak(now, now + 1)) return true;
  }
  return false;
}

void ConnectionGate::give_back() {
  taken_.fetch_sub(1);
  // Sequentially consistent with take_or_park's count: either this sees the parked acceptor,
  // or that acceptor's try_take sees the slot freed here.
  if (parked_count_.load() == 0) return;
  std::vector<Parked> woken;
  {
    std::lock_guard lock(mutex_);
    woken.swap(parked_);
    parked_count_.store(0);
    settle_pause_locked(Clock::now());
  }
  for (auto& p : woken) p.wake();
}

void ConnectionGate::park_locked(const void* id, Wake wake) {
  const auto it =
      std::find_if(parked_.begin(), parked_.end(), [id](const Parked& p) { return p.id == id; });
  if (it != parked_.end()) {
    it->wake = std::move(wake);
    return;
  }
  if (parked_.empty()) paused_since_ = Clock::now();
  parked_.push_back({id, std::move(wake)});
}

bool ConnectionGate::take_or_park(const void* id, Wake wake) {
  std::lock_guard lock(mutex_);
  parked_count_.fetch_add(1);
  if (try_take()) {
    parked_count_.store(parked_.size());
    return true;
  }
  park_locked(id, std::move(wake));
  parked_count_.store(parked_.size());
  return false;
}

void ConnectionGate::park(const void* id, Wake wake) {
  std::lock_guard lock(mutex_);
  park_locked(id, std::move(wake));
  parked_count_.store(parked_.size());
}

void ConnectionGate::unpark(const void* id) {
  std::lock_guard lock(mutex_);
  const auto it =
      std::find_if(parked_.begin(), parked_.end(), [id](const Parked& p) { return p.id == id; });
  if (it == parked_.end()) return;
  parked_.erase(it);
  parked_count_.store(parked_.size());
  if (parked_.empty()) settle_pause_locked(Clock::now());
}

void ConnectionGate::settle_pause_locked(Clock::time_point now) {
  if (paused_since_ == Clock::time_point{}) return;
  paused_total_ += now - paused_since_;
  paused_since_ = {};
}

double ConnectionGate::paused_seconds() const {
  std::lock_guard lock(mutex_);
  auto total = paused_total_;
  if (paused_since_ != Clock::time_point{}) total += Clock::now() - paused_since_;
  return std::chrono::duration<double>(total).count();
}

void ConnectionGate::note_pause(std::string_view reason) {
  std::uint64_t count = 0;
  std::chrono::system_clock::time_point wall;
  {
    std::lock_guard lock(log_mutex_);
    ++unreported_;
    const auto now = Clock::now();
    if (logged_ && now - last_line_ < std::chrono::seconds(1)) return;
    logged_ = true;
    last_line_ = now;
    // The line's time is this reading's: lines are a second apart by it too.
    wall = std::chrono::system_clock::now();
    count = std::exchange(unreported_, 0);
  }
  // Outside the mutex: the line is written by the logger's own thread anyway.
  boost::json::object fields{{"time", format_rfc3339(wall)},
                             {"listener", listener_},
                             {"reason", std::string(reason)},
                             {"count", count}};
  if (max_ > 0) {
    fields["client_connections"] = taken();
    fields["max_connections"] = max_;
  }
  log_json(spdlog::level::warn, "accept paused", std::move(fields));
}

}  // namespace idemgate::http
