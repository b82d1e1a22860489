#include "gateway/http/header_deadlines.hpp"

#include <boost/system/error_code.hpp>

namespace idemgate::http {

HeaderDeadlines::HeaderDeadlines(boost::asio::any_io_executor executor)
    : timer_(std::move(executor)) {}

HeaderDeadlines::~HeaderDeadlines() {
  entries_.clear();
  timer_.cancel();
}

void HeaderDeadlines::add(Entry& entry) {
  entries_.insert(entry);
  if (entry.deadline < armed_) arm(entry.deadline);
}

void HeaderDeadlines::remove(Entry& entry) noexcept {
  // A removed earliest entry leaves the timer armed: it fires once more and re-arms for the
  // entry then earliest, which costs less than a cancel and a re-arm per header that completes.
  if (entry.is_linked()) entries_.erase(entries_.iterator_to(entry));
}

void HeaderDeadlines::arm(Clock::time_point when) {
  armed_ = when;
  timer_.expires_at(when);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // re-armed (an earlier deadline) or destroyed
    armed_ = Clock::time_point::max();
    on_timer();
  });
}

void HeaderDeadlines::on_timer() {
  const auto now = Clock::now();
  while (!entries_.empty() && entries_.begin()->deadline <= now) {
    Entry& entry = *entries_.begin();
    entries_.erase(entries_.begin());
    boost::system::error_code ignored;
    entry.socket->close(ignored);  // ends the read waiting on it with operation_aborted
    ++expired_;
  }
  if (!entries_.empty()) arm(entries_.begin()->deadline);
}

}  // namespace idemgate::http
