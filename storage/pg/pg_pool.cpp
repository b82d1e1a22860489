#include "storage/pg/pg_pool.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <list>
#include <random>

#include "gateway/common/use_nothrow.hpp"

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;
using core::store_errc;

using common::use_nothrow;

// A coroutine waiting for a free slot. Its timer expires at the waiter's deadline; cancelling it
// is the wake-up call. Leaves the queue however the wait ends, including by the waiting
// coroutine being destroyed.
struct Waiter {
  Waiter(asio::any_io_executor executor, Deadline deadline, std::list<Waiter*>& queue)
      : timer(std::move(executor), deadline), queue_(queue) {
    position_ = queue_.insert(queue_.end(), this);
  }
  ~Waiter() {
    if (queued) queue_.erase(position_);
  }
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  asio::steady_timer timer;
  bool queued = true;

 private:
  std::list<Waiter*>& queue_;
  std::list<Waiter*>::iterator position_;
};

}  // namespace

struct PgPool::Lease::Shared {
  asio::any_io_executor executor;
  Options options;
  std::vector<std::unique_ptr<PgConnection>> idle;
  std::size_t open = 0;
  std::list<Waiter*> waiters;
  std::uint64_t connect_attempts = 0;

  // Reconnect gate: set by a failed connect, cleared by a successful one. While set, one attempt
  // at a time (`attempting`), none before `retry_at`; callers wait in `gate_waiters`.
  bool failing = false;
  bool attempting = false;
  std::uint64_t attempts_ended = 0;  ///< connect attempts that succeeded or failed
  std::chrono::steady_clock::time_point retry_at{};
  std::chrono::milliseconds backoff{0};
  std::list<Waiter*> gate_waiters;
  std::minstd_rand random{std::random_device{}()};

  void connect_failed(bool gated) {
    if (!failing || backoff.count() == 0) {
      failing = true;
      backoff = options.reconnect_backoff_first;
    } else if (gated) {
      backoff = std::min(backoff * 2, options.reconnect_backoff_max);
    }
    // Full jitter: the pools of every io thread and gateway cut off by the same failure do not
    // come back in step.
    std::uniform_int_distribution<std::chrono::milliseconds::rep> pause(0, backoff.count());
    retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(pause(random));
    ++attempts_ended;
    wake_gate();
  }

  void connect_succeeded(const PgConnection& connection) {
    if (options.tracker) options.tracker->use({}, connection.server_address());
    ++attempts_ended;
    if (!failing) return;
    failing = false;
    backoff = std::chrono::milliseconds(0);
    wake_gate();
  }

  void wake_gate() {
    for (Waiter* waiter : gate_waiters) {
      waiter->queued = false;
      waiter->timer.cancel();
    }
    gate_waiters.clear();
  }

  void give_back(std::unique_ptr<PgConnection> connection) {
    if (connection->broken() || connection->busy() || !connection->connected()) {
      --open;
    } else {
      idle.push_back(std::move(connection));
    }
    wake_one();
  }

  // A connection came back or a slot was freed: the first waiting caller looks again. Callers
  // at the reconnect gate may take an idle connection too.
  void wake_one() {
    auto& queue = waiters.empty() ? gate_waiters : waiters;
    if (queue.empty()) return;
    Waiter* waiter = queue.front();
    queue.pop_front();
    waiter->queued = false;
    waiter->timer.cancel();
  }
};

PgPool::Lease::Lease(std::weak_ptr<Shared> pool, std::unique_ptr<PgConnection> connection) noexcept
    : pool_(std::move(pool)), connection_(std::move(connection)) {}

PgPool::Lease::~Lease() {
  if (!connection_) return;  // moved from
  if (auto pool = pool_.lock()) pool->give_back(std::move(connection_));
}

PgPool::PgPool(asio::any_io_executor executor, Options options)
    : shared_(std::make_shared<Lease::Shared>()) {
  if (options.max_connections == 0) options.max_connections = 1;
  if (options.statement_timeout.count() <= 0) {
    options.statement_timeout = options.operation_timeout + std::chrono::seconds(1);
  }
  shared_->executor = std::move(executor);
  shared_->options = std::move(options);
}

PgPool::~PgPool() = default;

Deadline PgPool::deadline() const {
  return std::chrono::steady_clock::now() + shared_->options.operation_timeout;
}

const PgPool::Options& PgPool::options() const noexcept {
  return shared_->options;
}

std::size_t PgPool::open_connections() const noexcept {
  return shared_->open;
}

std::size_t PgPool::idle_connections() const noexcept {
  return shared_->idle.size();
}

std::uint64_t PgPool::connect_attempts() const noexcept {
  return shared_->connect_attempts;
}

asio::awaitable<boost::system::result<PgPool::Lease>> PgPool::acquire(Deadline deadline) {
  // Held for the whole wait: the pool object may go away while this coroutine is suspended.
  const std::shared_ptr<Lease::Shared> pool = shared_;
  for (;;) {
    while (!pool->idle.empty()) {
      // Most recently used first: it is the likeliest to be warm and alive.
      Lease lease(pool, std::move(pool->idle.back()));
      pool->idle.pop_back();
      if (lease->probe_idle()) co_return lease;
      // Dropping the broken lease frees its slot.
    }
    if (pool->open < pool->options.max_connections) {
      const bool gated = pool->failing;
      if (gated && (pool->attempting || std::chrono::steady_clock::now() < pool->retry_at)) {
        // The store is failing and another caller's attempt runs, or the backoff has not
        // passed: wait for that attempt's outcome or the next turn, within this deadline. No
        // attempt may start before the deadline: nothing to wait for.
        if (!pool->attempting && pool->retry_at >= deadline) co_return store_errc::unavailable;
        const std::uint64_t ended = pool->attempts_ended;
        const auto until = pool->attempting ? deadline : std::min(deadline, pool->retry_at);
        Waiter waiter(pool->executor, until, pool->gate_waiters);
        co_await waiter.timer.async_wait(use_nothrow);
        // The attempt this caller waited for failed: the store still fails, and the answer is
        // due now rather than at the deadline (C25).
        const bool failed_meanwhile = pool->failing && pool->attempts_ended != ended;
        if (failed_meanwhile || std::chrono::steady_clock::now() >= deadline) {
          if (!waiter.queued) pool->wake_one();  // a returned connection goes to the next
          co_return store_errc::unavailable;
        }
        continue;
      }
      ++pool->open;
      ++pool->connect_attempts;
      // Leased before connecting so that a failed or abandoned connect frees the slot.
      Lease lease(pool, std::make_unique<PgConnection>(
                            pool->executor, pool->options.dsn, pool->options.statement_timeout,
                            pool->options.prepared_statements, pool->options.key_plans));
      // Ended however the attempt ends, also by this coroutine being destroyed mid-connect:
      // the callers waiting for it must not wait for nothing.
      struct Attempt {
        Lease::Shared* pool;
        ~Attempt() {
          if (!pool) return;
          pool->attempting = false;
          pool->wake_gate();
        }
      } attempt{gated ? pool.get() : nullptr};
      if (gated) pool->attempting = true;
      auto connected = co_await lease->connect(deadline);
      attempt.pool = nullptr;
      if (gated) pool->attempting = false;
      if (!connected) {
        pool->connect_failed(gated);
        co_return connected.error();
      }
      pool->connect_succeeded(*lease);
      co_return lease;
    }

    Waiter waiter(pool->executor, deadline, pool->waiters);
    auto [ec] = co_await waiter.timer.async_wait(use_nothrow);
    if (!ec) {
      // Deadline passed with every slot in use. A wake-up that raced with it goes to the next.
      if (!waiter.queued) pool->wake_one();
      co_return store_errc::timed_out;
    }
  }
}

asio::awaitable<boost::system::result<PgResult>> PgPool::execute(Statement statement,
                                                                 std::vector<Param> params) {
  const Deadline until = deadline();
  auto lease = co_await acquire(until);
  if (!lease) co_return lease.error();
  co_return co_await (*lease)->execute(statement, std::move(params), until);
}

asio::awaitable<boost::system::result<PgResult>> PgPool::query(std::string sql,
                                                               std::vector<Param> params) {
  const Deadline until = deadline();
  auto lease = co_await acquire(until);
  if (!lease) co_return lease.error();
  co_return co_await (*lease)->query(std::move(sql), std::move(params), until);
}

}  // namespace idemgate::storage::pg
