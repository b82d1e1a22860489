#include "gateway/metrics.hpp"

#include <prometheus/text_serializer.h>

#include <atomic>
#include <boost/asio/this_coro.hpp>
#include <sstream>

namespace idemgate {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

const prometheus::Histogram::BucketBoundaries& upstream_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets{
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& store_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return buckets;
}

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

std::atomic<std::uint64_t> next_metrics_id{1};

template <class T>
using ByName = std::map<std::string, T, std::less<>>;

/// `map[key]`, made by `make()` when missing; looked up without building a std::string.
template <class T, class Make>
T& find_or_make(ByName<T>& map, std::string_view key, Make make) {
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(std::string(key), make()).first;
  return it->second;
}

}  // namespace

/// Children of the label-bearing families this thread has used: the addresses Family::Add
/// returned (stable: a family keeps its children until it is destroyed, and none is removed).
struct Metrics::ThreadCache {
  std::uint64_t owner = 0;
  ByName<ByName<prometheus::Counter*>> requests;  // route → outcome
  ByName<prometheus::Histogram*> upstream;        // route
  ByName<ByName<prometheus::Histogram*>> store;   // store → op
};

Metrics::ThreadCache& Metrics::thread_cache() {
  thread_local ThreadCache cache;
  if (cache.owner != id_) {
    // Another instance used this thread before (tests make several): start over.
    cache = ThreadCache{};
    cache.owner = id_;
  }
  return cache;
}

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("idemgate_requests_total")
                    .Help("Requests answered, by route and outcome (SPEC C31)")
                    .Register(*registry_)),
      upstream_duration_(prometheus::BuildHistogram()
                             .Name("idemgate_upstream_duration_seconds")
                             .Help("Duration of upstream exchanges, by route")
                             .Register(*registry_)),
      store_duration_(prometheus::BuildHistogram()
                          .Name("idemgate_store_duration_seconds")
                          .Help("Duration of store operations, by store and operation")
                          .Register(*registry_)),
      lock_contention_(prometheus::BuildCounter()
                           .Name("idemgate_lock_contention_total")
                           .Help("Lock attempts that found the key held by another request")
                           .Register(*registry_)
                           .Add({})),
      duplicate_executions_(
          prometheus::BuildCounter()
              .Name("idemgate_duplicate_executions_total")
              .Help("Executions whose record insert found another committed record (C36)")
              .Register(*registry_)
              .Add({})),
      commit_failures_(prometheus::BuildCounter()
                           .Name("idemgate_record_commit_failures_total")
                           .Help("Records that could not be committed after the upstream "
                                 "answered (C26)")
                           .Register(*registry_)
                           .Add({})),
      store_errors_(prometheus::BuildCounter()
                        .Name("idemgate_store_errors_total")
                        .Help("Failed store operations of the idempotency filter, by operation "
                              "(a C26 commit retry counts each failed attempt)")
                        .Register(*registry_)),
      task_failures_(prometheus::BuildCounter()
                         .Name("idemgate_task_failures_total")
                         .Help("Background tasks (lock renewal) that ended with an exception")
                         .Register(*registry_)),
      store_failovers_(prometheus::BuildCounter()
                           .Name("idemgate_store_failovers_total")
                           .Help("Switches to a different store primary than the one in use "
                                 "(C46), by store")
                           .Register(*registry_)),
      cleanup_deleted_(prometheus::BuildCounter()
                           .Name("idemgate_cleanup_deleted_total")
                           .Help("Expired records deleted by the cleaner (C24)")
                           .Register(*registry_)
                           .Add({})),
      client_connections_(prometheus::BuildGauge()
                              .Name("idemgate_client_connections")
                              .Help("Client connections open now (C52)")
                              .Register(*registry_)
                              .Add({})),
      accept_paused_(prometheus::BuildCounter()
                         .Name("idemgate_accept_paused_seconds_total")
                         .Help("Seconds during which accepting was paused: at max_connections or "
                               "for lack of descriptors (C52)")
                         .Register(*registry_)),
      max_connections_(prometheus::BuildGauge()
                           .Name("idemgate_max_connections")
                           .Help("The limit on client connections in force (limits."
                                 "max_connections, C52)")
                           .Register(*registry_)),
      pending_commits_(prometheus::BuildGauge()
                           .Name("idemgate_pending_commits")
                           .Help("Keyed requests holding a place in the Postgres commit queue, "
                                 "at most storage.postgres.max_pending (C54)")
                           .Register(*registry_)),
      in_flight_locks_(prometheus::BuildGauge()
                           .Name("idemgate_in_flight_locks")
                           .Help("In-flight locks held by this process now")
                           .Register(*registry_)
                           .Add({})),
      open_tunnels_(prometheus::BuildGauge()
                        .Name("idemgate_open_tunnels")
                        .Help("Upgrade tunnels (WebSocket) open now (C40)")
                        .Register(*registry_)
                        .Add({})),
      ready_(prometheus::BuildGauge()
                 .Name("idemgate_ready")
                 .Help("1 when the last readiness check (/readyz rule, C30) passed, else 0")
                 .Register(*registry_)
                 .Add({})),
      cleaner_last_run_(prometheus::BuildGauge()
                            .Name("idemgate_cleaner_last_run_timestamp_seconds")
                            .Help("Unix time of the cleaner's last successful statement (C24); "
                                  "its start time until then")
                            .Register(*registry_)),
      cleaner_interval_(prometheus::BuildGauge()
                            .Name("idemgate_cleaner_interval_seconds")
                            .Help("The cleaner's cleanup.interval (C24)")
                            .Register(*registry_)),
      id_(next_metrics_id++) {
  // Both series from the start, so "no failover yet" reads 0 rather than absent.
  store_failovers_.Add({{"store", "redis"}});
  store_failovers_.Add({{"store", "postgres"}});
}

void Metrics::count_request(std::string_view route, std::string_view outcome) {
  auto* counter = find_or_make(
      find_or_make(thread_cache().requests, route, [] { return ByName<prometheus::Counter*>{}; }),
      outcome, [&] {
        return &requests_.Add({{"route", std::string(route)}, {"outcome", std::string(outcome)}});
      });
  counter->Increment();
}

void Metrics::observe_upstream(std::string_view route, std::chrono::microseconds duration) {
  auto* histogram = find_or_make(thread_cache().upstream, route, [&] {
    return &upstream_duration_.Add({{"route", std::string(route)}}, upstream_buckets());
  });
  histogram->Observe(seconds(duration));
}

void Metrics::observe_store(const char* store, const char* op, std::chrono::nanoseconds duration) {
  auto* histogram = find_or_make(
      find_or_make(thread_cache().store, store, [] { return ByName<prometheus::Histogram*>{}; }),
      op, [&] {
        return &store_duration_.Add({{"store", store}, {"op", op}}, store_buckets());
      });
  histogram->Observe(seconds(duration));
}

void Metrics::count_lock_contention() {
  lock_contention_.Increment();
}

void Metrics::count_duplicate_execution() {
  duplicate_executions_.Increment();
}

void Metrics::count_store_error(std::string_view op) {
  store_errors_.Add({{"op", std::string(op)}}).Increment();
}

void Metrics::count_store_failover(std::string_view store) {
  store_failovers_.Add({{"store", std::string(store)}}).Increment();
}

void Metrics::count_task_failure(std::string_view task) {
  task_failures_.Add({{"task", std::string(task)}}).Increment();
}

void Metrics::count_record_commit_failure() {
  commit_failures_.Increment();
}

void Metrics::connection_opened() {
  client_connections_.Increment();
}

void Metrics::tunnel_opened() {
  open_tunnels_.Increment();
}

void Metrics::tunnel_closed() {
  open_tunnels_.Decrement();
}

void Metrics::connection_closed() {
  client_connections_.Decrement();
}

void Metrics::lock_taken() {
  in_flight_locks_.Increment();
}

void Metrics::lock_freed() {
  in_flight_locks_.Decrement();
}

void Metrics::set_cleanup_source(std::function<std::uint64_t()> source) {
  std::lock_guard lock(render_mutex_);
  cleanup_source_ = std::move(source);
}

void Metrics::set_cleaner_source(std::function<double()> last_run,
                                 std::chrono::milliseconds interval) {
  std::lock_guard lock(render_mutex_);
  cleaner_last_run_source_ = std::move(last_run);
  cleaner_last_run_.Add({});
  cleaner_interval_.Add({}).Set(std::chrono::duration<double>(interval).count());
}

void Metrics::set_overload_source(std::function<OverloadReadings()> source) {
  std::lock_guard lock(render_mutex_);
  overload_source_ = std::move(source);
  accept_paused_.Add({});
  max_connections_.Add({});
  pending_commits_.Add({});
}

void Metrics::set_ready(bool ready) {
  ready_.Set(ready ? 1.0 : 0.0);
}

void Metrics::note_unprotected() noexcept {
  last_unprotected_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                          std::memory_order_relaxed);
}

bool Metrics::unprotected_within(std::chrono::steady_clock::duration window) const noexcept {
  using Steady = std::chrono::steady_clock;
  const auto last = last_unprotected_.load(std::memory_order_relaxed);
  if (last == std::numeric_limits<Steady::rep>::min()) return false;
  return Steady::now() - Steady::time_point(Steady::duration(last)) < window;
}

std::string Metrics::render() {
  std::lock_guard lock(render_mutex_);
  if (cleanup_source_) {
    // The cleaner keeps its own total; the counter catches up with it (it only ever grows).
    const double total = static_cast<double>(cleanup_source_());
    const double shown = cleanup_deleted_.Value();
    if (total > shown) cleanup_deleted_.Increment(total - shown);
  }
  if (cleaner_last_run_source_) cleaner_last_run_.Add({}).Set(cleaner_last_run_source_());
  if (overload_source_) {
    const OverloadReadings now = overload_source_();
    auto& paused = accept_paused_.Add({});
    if (now.accept_paused_seconds > paused.Value()) {
      paused.Increment(now.accept_paused_seconds - paused.Value());
    }
    max_connections_.Add({}).Set(static_cast<double>(now.max_connections));
    pending_commits_.Add({}).Set(static_cast<double>(now.pending_commits));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

// ---------------------------------------------------------------------------------------------

asio::awaitable<boost::system::result<std::optional<core::StoredRecord>>> TimedRecordStore::find(
    core::Sha256 id) {
  const auto start = Clock::now();
  auto result = co_await inner_.find(id);
  metrics_.observe_store("postgres", "find", Clock::now() - start);
  co_return result;
}

asio::awaitable<boost::system::result<core::InsertResult>> TimedRecordStore::insert(
    core::StoredRecord record, std::chrono::milliseconds ttl) {
  const auto start = Clock::now();
  auto result = co_await inner_.insert(std::move(record), ttl);
  metrics_.observe_store("postgres", "insert", Clock::now() - start);
  co_return result;
}

// ---------------------------------------------------------------------------------------------

TimedLockService::~TimedLockService() {
  for (std::size_t i = 0; i < held_.size(); ++i) metrics_.lock_freed();
}

void TimedLockService::hold(const asio::any_io_executor& executor, const std::string& token,
                            std::chrono::milliseconds ttl) {
  if (!expiries_) expiries_ = std::make_unique<common::DeadlineList>(executor);
  auto [it, fresh] = held_.try_emplace(token);
  Held& held = it->second;
  if (fresh) {
    held.owner = this;
    held.token = &it->first;
    held.on_due = [](common::DeadlineList::Entry& entry) {
      // Its ttl ran out: the lock is gone from Redis whatever happened to its owner.
      auto& expired = static_cast<Held&>(entry);
      auto& self = *expired.owner;
      const auto found = self.held_.find(*expired.token);
      if (found == self.held_.end()) return;
      self.held_.erase(found);  // destroys `expired` and its key
      self.metrics_.lock_freed();
    };
    metrics_.lock_taken();
  } else {
    expiries_->remove(held);
  }
  held.deadline = common::DeadlineList::Clock::now() + ttl;
  expiries_->add(held);
}

void TimedLockService::forget(const std::string& token) {
  if (held_.erase(token) > 0) metrics_.lock_freed();
}

asio::awaitable<boost::system::result<core::Acquired>> TimedLockService::acquire(
    core::Sha256 id, std::string token, std::chrono::milliseconds ttl) {
  const auto executor = co_await asio::this_coro::executor;
  const auto start = Clock::now();
  auto result = co_await inner_.acquire(id, token, ttl);
  metrics_.observe_store("redis", "try_acquire", Clock::now() - start);
  if (result && result->acquired) hold(executor, token, ttl);
  co_return result;
}

asio::awaitable<boost::system::result<bool>> TimedLockService::renew(
    core::Sha256 id, std::string token, std::chrono::milliseconds ttl) {
  const auto executor = co_await asio::this_coro::executor;
  const auto start = Clock::now();
  auto result = co_await inner_.renew(id, token, ttl);
  metrics_.observe_store("redis", "renew", Clock::now() - start);
  if (result) {
    if (*result && held_.count(token) > 0) {
      hold(executor, token, ttl);
    } else if (!*result) {
      forget(token);
    }
  }
  co_return result;
}

asio::awaitable<boost::system::result<bool>> TimedLockService::release(core::Sha256 id,
                                                                       std::string token) {
  const auto start = Clock::now();
  auto result = co_await inner_.release(id, token);
  metrics_.observe_store("redis", "release", Clock::now() - start);
  // Released or not ours any more: either way this process no longer holds it. After an error
  // the lock may still exist; it ends with its ttl, which the timer still tracks.
  if (result) forget(token);
  co_return result;
}

asio::awaitable<boost::system::result<bool>> TimedLockService::replace(
    core::Sha256 id, std::string token, std::string value, std::chrono::milliseconds ttl) {
  const auto start = Clock::now();
  auto result = co_await inner_.replace(id, token, std::move(value), ttl);
  metrics_.observe_store("redis", "replace", Clock::now() - start);
  // Replaced by the marker, or not ours any more: the lock is no longer held here.
  if (result) forget(token);
  co_return result;
}

}  // namespace idemgate
