#include "storage/pg/pg_pool.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <list>

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;
using core::store_errc;

inline constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

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

  void give_back(std::unique_ptr<PgConnection> connection) {
    if (connection->broken() || connection->busy() || !connection->connected()) {
      --open;
    } else {
      idle.push_back(std::move(connection));
    }
    wake_one();
  }

  void wake_one() {
    if (waiters.empty()) return;
    Waiter* waiter = waiters.front();
    waiters.pop_front();
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
      ++pool->open;
      // Leased before connecting so that a failed or abandoned connect frees the slot.
      Lease lease(pool, std::make_unique<PgConnection>(pool->executor, pool->options.dsn,
                                                       pool->options.statement_timeout,
                                                       pool->options.prepared_statements));
      auto connected = co_await lease->connect(deadline);
      if (!connected) co_return connected.error();
      if (pool->options.tracker) pool->options.tracker->use({}, lease->server_address());
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
