#include "gateway/common/deadline_list.hpp"

#include <boost/system/error_code.hpp>

namespace idemgate::common {

DeadlineList::DeadlineList(boost::asio::any_io_executor executor) : timer_(std::move(executor)) {}

DeadlineList::~DeadlineList() {
  entries_.clear();  // safe_link: every entry is left unlinked, so its Guard does not come back
  timer_.cancel();
}

void DeadlineList::add(Entry& entry) {
  entries_.insert(entry);
  if (entry.deadline < armed_) arm(entry.deadline);
}

void DeadlineList::remove(Entry& entry) noexcept {
  if (!entry.is_linked()) return;
  entries_.erase(entries_.iterator_to(entry));
  // Nothing left to time: a timer due later than kLinger stops, so that an idle thread has no
  // work pending (its io_context can run out of work) and wakes for nothing. One due sooner
  // fires once for nothing: entries that come and go one at a time (a quick exchange's) then
  // cost no arm and cancel each.
  if (entries_.empty() && armed_ != Clock::time_point::max() && armed_ - Clock::now() > kLinger) {
    armed_ = Clock::time_point::max();
    timer_.cancel();
  }
}

void DeadlineList::arm(Clock::time_point when) {
  armed_ = when;
  timer_.expires_at(when);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // re-armed (an earlier deadline) or destroyed
    armed_ = Clock::time_point::max();
    on_timer();
  });
}

void DeadlineList::on_timer() {
  const auto now = Clock::now();
  while (!entries_.empty() && entries_.begin()->deadline <= now) {
    Entry& entry = *entries_.begin();
    entries_.erase(entries_.begin());
    ++expired_;
    entry.on_due(entry);  // may add it again, later: the loop then stops before it
  }
  if (!entries_.empty() && entries_.begin()->deadline < armed_) arm(entries_.begin()->deadline);
}

}  // namespace idemgate::common
