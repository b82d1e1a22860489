#include "gateway/http/admission.hpp"

#include <utility>

namespace idemgate::http {

namespace {

std::atomic<std::uint64_t> next_admission_id{1};

/// This thread's route counts of one Admission, by name.
struct ThreadCache {
  std::uint64_t owner = 0;
  std::map<std::string, std::atomic<std::size_t>*, std::less<>> counts;
};

}  // namespace

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (count_ && held_) count_->fetch_sub(1);
    count_ = std::exchange(other.count_, nullptr);
    held_ = other.held_;
  }
  return *this;
}

Admission::Ticket::~Ticket() {
  if (count_ && held_) count_->fetch_sub(1);
}

Admission::Admission() : id_(next_admission_id++) {}

Admission::Ticket Admission::take(std::atomic<std::size_t>& count, std::size_t max) {
  std::size_t now = count.load();
  while (now < max) {
    if (count.compare_exchange_weak(now, now + 1)) return Ticket(&count, true);
  }
  return Ticket(nullptr, false);
}

std::atomic<std::size_t>& Admission::count_of(std::string_view route) {
  thread_local ThreadCache cache;
  if (cache.owner != id_) {
    cache = ThreadCache{};
    cache.owner = id_;
  }
  if (const auto it = cache.counts.find(route); it != cache.counts.end()) return *it->second;
  std::lock_guard lock(mutex_);
  auto it = counts_.find(route);
  if (it == counts_.end()) {
    it = counts_.emplace(std::string(route), std::make_unique<std::atomic<std::size_t>>(0)).first;
  }
  cache.counts.emplace(std::string(route), it->second.get());
  return *it->second;
}

Admission::Ticket Admission::enter(const Route& route) {
  if (route.max_in_flight == 0) return Ticket(nullptr, true);
  return take(count_of(route.name), route.max_in_flight);
}

Admission::Ticket Admission::open_tunnel(std::size_t max_tunnels) {
  return take(tunnels_, max_tunnels);
}

std::size_t Admission::in_flight(std::string_view route) const {
  std::lock_guard lock(mutex_);
  const auto it = counts_.find(route);
  return it == counts_.end() ? 0 : it->second->load(std::memory_order_relaxed);
}

}  // namespace idemgate::http
