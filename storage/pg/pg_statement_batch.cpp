#include "storage/pg/pg_statement_batch.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <deque>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/core/errors.hpp"

namespace idemgate::storage::pg {

namespace asio = boost::asio;
using common::use_nothrow;

BatchItem::BatchItem(asio::any_io_executor executor, Deadline deadline)
    : deadline_(deadline), wake_(std::move(executor)) {
  wake_.expires_at(deadline);
}

bool BatchItem::settle_once() {
  if (settled_) return false;
  settled_ = true;
  wake_.cancel();
  return true;
}

struct StatementBatch::State {
  asio::any_io_executor executor;
  Options options;
  Send send;
  std::deque<std::shared_ptr<BatchItem>> queue;
  std::size_t in_flight = 0;
  bool stopped = false;
  std::uint64_t batches = 0;
  std::uint64_t items = 0;
};

namespace {

using Queue = std::deque<std::shared_ptr<BatchItem>>;

// Up to max_batch live items from the front of the queue, no id twice; the items passed over
// keep their place in the queue.
StatementBatch::Items take_batch(Queue& queue, std::size_t max_batch) {
  StatementBatch::Items batch;
  Queue passed_over;
  std::unordered_set<std::string_view> ids;
  const auto now = std::chrono::steady_clock::now();
  while (!queue.empty() && batch.size() < max_batch) {
    auto item = std::move(queue.front());
    queue.pop_front();
    // A caller whose deadline has passed is answered by its own timer.
    if (item->abandoned() || item->settled() || item->deadline() <= now) continue;
    if (!ids.insert(item->id()).second) {
      passed_over.push_back(std::move(item));
      continue;
    }
    batch.push_back(std::move(item));
  }
  while (!passed_over.empty()) {
    queue.push_front(std::move(passed_over.back()));
    passed_over.pop_back();
  }
  return batch;
}

asio::awaitable<void> flush(std::shared_ptr<StatementBatch::State> state);

void start_flush(const std::shared_ptr<StatementBatch::State>& state) {
  if (state->stopped || state->queue.empty() || state->in_flight >= state->options.max_in_flight) {
    return;
  }
  ++state->in_flight;
  asio::co_spawn(state->executor, flush(state),
                 common::log_on_exception("postgres: statement batch failed"));
}

// Sends batches until the queue is empty. Runs while the next batch accumulates behind it.
asio::awaitable<void> flush(std::shared_ptr<StatementBatch::State> state) {
  struct InFlight {
    StatementBatch::State& s;
    ~InFlight() { --s.in_flight; }
  } in_flight{*state};

  while (!state->stopped) {
    const auto batch = take_batch(state->queue, std::max<std::size_t>(1, state->options.max_batch));
    if (batch.empty()) break;
    Deadline until = batch.front()->deadline();
    for (const auto& item : batch) until = std::max(until, item->deadline());
    ++state->batches;
    state->items += batch.size();
    co_await state->send(batch, until);
    // A send that left an item unsettled must not leave its caller waiting for the deadline.
    for (const auto& item : batch) item->fail(make_error_code(core::store_errc::unavailable));
  }
}

}  // namespace

StatementBatch::StatementBatch(asio::any_io_executor executor, Options options, Send send)
    : state_(std::make_shared<State>()) {
  state_->executor = std::move(executor);
  state_->options = options;
  state_->send = std::move(send);
}

StatementBatch::~StatementBatch() {
  state_->stopped = true;
  for (const auto& item : state_->queue) {
    item->fail(make_error_code(core::store_errc::unavailable));
  }
  state_->queue.clear();
}

asio::awaitable<bool> StatementBatch::submit(std::shared_ptr<BatchItem> item) {
  state_->queue.push_back(item);
  start_flush(state_);

  // Runs also when this coroutine is destroyed while it waits.
  struct Abandon {
    BatchItem& item;
    ~Abandon() {
      if (!item.settled()) item.abandoned_ = true;
    }
  } abandon{*item};
  co_await item->wake_.async_wait(use_nothrow);
  co_return item->settled();
}

const asio::any_io_executor& StatementBatch::executor() const noexcept {
  return state_->executor;
}

std::uint64_t StatementBatch::batches_sent() const noexcept {
  return state_->batches;
}

std::uint64_t StatementBatch::items_sent() const noexcept {
  return state_->items;
}

}  // namespace idemgate::storage::pg
