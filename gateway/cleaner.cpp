#include "gateway/cleaner.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/object.hpp>

#include <algorithm>
#include <chrono>

#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"

namespace idemgate {
namespace asio = boost::asio;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Cleaner::State {
  State(const config::Config& config, std::shared_ptr<core::PrimaryTracker> pg_primary)
      : io(std::make_unique<asio::io_context>()),
        interval(config.storage.cleanup.interval),
        batch(config.storage.cleanup.batch),
        pool(io->get_executor(), {config.storage.postgres.dsn,
                                  1,
                                  config.storage.postgres.operation_timeout,
                                  {},
                                  config.storage.postgres.prepared_statements,
                                  std::move(pg_primary)}),
        store(pool) {}
  // Members go in reverse order: the store and the pool first, closing their sockets and timers
  // while the io_context's services exist; then the io_context, which destroys the pending
  // coroutine frame. A frame never resumes again, and what it may hold refers to the pool only
  // weakly (a Lease gives its connection back through a weak_ptr, else closes it). Destroying the
  // io_context first left the pool's sockets to deregister from freed services at exit.
  std::unique_ptr<asio::io_context> io;
  std::chrono::milliseconds interval;
  int batch;
  storage::pg::PgPool pool;
  storage::pg::PgRecordStore store;
};

Cleaner::Cleaner(const config::Config& config, std::shared_ptr<core::PrimaryTracker> pg_primary)
    : state_(std::make_unique<State>(config, std::move(pg_primary))) {}

Cleaner::~Cleaner() {
  stop();
}

namespace {

// One round (C24): batches until one comes back short, on every partition in turn when the
// table is hash-partitioned (`idemgate migrate --partitions N`; the list is read each round, so
// a conversion while the gateway runs is picked up), else on the table. A failure ends the
// round; the next interval tries again.
// last_run: the time of each statement that succeeded
// (idemgate_cleaner_last_run_timestamp_seconds).
asio::awaitable<void> clean_once(storage::pg::PgRecordStore* store, int batch,
                                 std::atomic<std::uint64_t>* total, std::atomic<double>* last_run) {
  auto partitions = co_await store->partitions();
  if (!partitions) {
    common::log_json(spdlog::level::warn, "cleanup failed; retrying next interval",
                     {{"error", partitions.error().message()}});
    co_return;
  }
  std::int64_t round = 0;
  const std::size_t targets = std::max<std::size_t>(partitions->size(), 1);
  for (std::size_t target = 0; target < targets; ++target) {
    for (;;) {
      boost::system::result<std::int64_t> deleted = 0;
      if (partitions->empty()) {
        deleted = co_await store->delete_expired(batch);
      } else {
        deleted = co_await store->delete_expired(batch, (*partitions)[target]);
      }
      if (!deleted) {
        common::log_json(spdlog::level::warn, "cleanup failed; retrying next interval",
                         {{"error", deleted.error().message()}});
        co_return;
      }
      last_run->store(unix_now(), std::memory_order_relaxed);
      round += *deleted;
      total->fetch_add(static_cast<std::uint64_t>(*deleted), std::memory_order_relaxed);
      if (*deleted < batch) break;
    }
  }
  if (round > 0) {
    boost::json::object fields{{"deleted", round}};
    if (!partitions->empty()) fields["partitions"] = partitions->size();
    common::log_json(spdlog::level::info, "expired records deleted", std::move(fields));
  }
}

}  // namespace

void Cleaner::start() {
  State* state = state_.get();
  std::atomic<std::uint64_t>* total = &deleted_total_;
  std::atomic<double>* last_run = &last_run_;
  last_run->store(unix_now(), std::memory_order_relaxed);
  asio::co_spawn(
      *state->io,
      [state, total, last_run]() -> asio::awaitable<void> {
        asio::steady_timer timer(*state->io);
        for (;;) {
          timer.expires_after(state->interval);
          auto [ec] = co_await timer.async_wait(common::use_nothrow);
          if (ec) co_return;
          co_await clean_once(&state->store, state->batch, total, last_run);
        }
      },
      common::log_on_exception("cleaner stopped"));
  thread_ = std::thread([state] { state->io->run(); });
}

void Cleaner::stop() {
  if (!thread_.joinable()) return;
  state_->io->stop();
  thread_.join();
}

}  // namespace idemgate
