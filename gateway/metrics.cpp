#include "gateway/metrics.hpp"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/this_coro.hpp>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

namespace idemgate {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<double>& upstream_buckets() {
  static const std::vector<double> buckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                           1,     2.5,  5,     10,   30,  60};
  return buckets;
}

const std::vector<double>& store_buckets() {
  static const std::vector<double> buckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                           0.05,   0.1,   0.25,   0.5,   1,    2.5};
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

/// A counter or histogram family whose every child keeps one set of numbers per thread that
/// used it (a shard). A shard has one writer, its thread, so an observation is relaxed loads and
/// stores without a lock or a read-modify-write on a line the io threads share (prometheus-cpp's
/// Histogram takes a mutex per Observe, its Counter a compare-and-swap loop). collect() adds the
/// shards of each label set up, for the text exposition; shards live as long as the family.
class Metrics::ShardedFamily {
 public:
  /// Numbers of one label set written by one thread. Histogram: a count per bucket (not
  /// cumulative; the last one is +Inf) and the sum of the values. Counter: the sum only.
  class Shard {
   public:
    explicit Shard(const std::vector<double>& bounds)
        : bounds_(bounds),
          counts_(std::make_unique<std::atomic<std::uint64_t>[]>(bounds.size() + 1)) {}

    /// Histogram: one value (seconds); `value <= bound` counts in that bound's bucket.
    void observe(double value) noexcept {
      const auto bucket = static_cast<std::size_t>(
          std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
      bump(counts_[bucket], 1);
      add(value);
    }
    /// Counter: one more.
    void increment() noexcept { add(1.0); }

   private:
    friend class ShardedFamily;
    static void bump(std::atomic<std::uint64_t>& n, std::uint64_t by) noexcept {
      n.store(n.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
    void add(double value) noexcept {
      sum_.store(sum_.load(std::memory_order_relaxed) + value, std::memory_order_relaxed);
    }
    const std::vector<double>& bounds_;
    std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;
    std::atomic<double> sum_{0.0};
  };

  /// A histogram family with these bucket bounds (ascending), or a counter family (no bounds).
  ShardedFamily(std::string name, std::string help, prometheus::MetricType type,
                std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), type_(type), bounds_(std::move(bounds)) {}

  /// A new shard of the label set `labels` for the calling thread, which keeps its address.
  Shard& add(std::vector<prometheus::ClientMetric::Label> labels) {
    std::lock_guard lock(mutex_);
    auto& shards = children_[std::move(labels)];
    shards.push_back(std::make_unique<Shard>(bounds_));
    return *shards.back();
  }

  /// The family for the text serializer: per label set, the sums over its shards.
  prometheus::MetricFamily collect() const {
    prometheus::MetricFamily family{name_, help_, type_, {}};
    std::lock_guard lock(mutex_);
    for (const auto& [labels, shards] : children_) {
      prometheus::ClientMetric metric;
      metric.label = labels;
      std::vector<std::uint64_t> counts(bounds_.size() + 1, 0);
      double sum = 0.0;
      for (const auto& shard : shards) {
        for (std::size_t i = 0; i < counts.size(); ++i) {
          counts[i] += shard->counts_[i].load(std::memory_order_relaxed);
        }
        sum += shard->sum_.load(std::memory_order_relaxed);
      }
      if (type_ == prometheus::MetricType::Counter) {
        metric.counter.value = sum;
      } else {
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          metric.histogram.bucket.push_back(
              {cumulative,
               i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity()});
        }
        metric.histogram.sample_count = cumulative;
        metric.histogram.sample_sum = sum;
      }
      family.metric.push_back(std::move(metric));
    }
    return family;
  }

 private:
  const std::string name_;
  const std::string help_;
  const prometheus::MetricType type_;
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::map<std::vector<prometheus::ClientMetric::Label>, std::vector<std::unique_ptr<Shard>>>
      children_;
};

/// This thread's shards of the per-request families (each written by this thread only).
struct Metrics::ThreadCache {
  std::uint64_t owner = 0;
  ByName<ByName<ShardedFamily::Shard*>> requests;  // route → outcome
  ByName<ShardedFamily::Shard*> upstream;          // route
  ByName<ByName<ShardedFamily::Shard*>> store;     // store → op
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
      requests_(std::make_unique<ShardedFamily>(
          "idemgate_requests_total", "Requests answered, by route and outcome (SPEC C31)",
          prometheus::MetricType::Counter)),
      upstream_duration_(std::make_unique<ShardedFamily>(
          "idemgate_upstream_duration_seconds", "Duration of upstream exchanges, by route",
          prometheus::MetricType::Histogram, upstream_buckets())),
      store_duration_(std::make_unique<ShardedFamily>(
          "idemgate_store_duration_seconds", "Duration of store operations, by store and operation",
          prometheus::MetricType::Histogram, store_buckets())),
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
      h2_connections_(prometheus::BuildGauge()
                          .Name("idemgate_h2_connections")
                          .Help("HTTP/2 client connections open now (C49)")
                          .Register(*registry_)
                          .Add({})),
      h2_streams_(prometheus::BuildCounter()
                      .Name("idemgate_h2_streams_total")
                      .Help("Requests that came as HTTP/2 streams (C49)")
                      .Register(*registry_)
                      .Add({})),
      h2_cuts_(prometheus::BuildCounter()
                   .Name("idemgate_h2_connections_ended_total")
                   .Help("HTTP/2 connections ended for passing a bound of C51, by reason")
                   .Register(*registry_)),
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

Metrics::~Metrics() = default;

void Metrics::count_request(std::string_view route, std::string_view outcome) {
  auto* shard = find_or_make(
      find_or_make(thread_cache().requests, route, [] { return ByName<ShardedFamily::Shard*>{}; }),
      outcome, [&] {
        return &requests_->add({{"route", std::string(route)}, {"outcome", std::string(outcome)}});
      });
  shard->increment();
}

void Metrics::observe_upstream(std::string_view route, std::chrono::microseconds duration) {
  auto* shard = find_or_make(thread_cache().upstream, route, [&] {
    return &upstream_duration_->add({{"route", std::string(route)}});
  });
  shard->observe(seconds(duration));
}

void Metrics::observe_store(const char* store, const char* op, std::chrono::nanoseconds duration) {
  auto* shard = find_or_make(
      find_or_make(thread_cache().store, store, [] { return ByName<ShardedFamily::Shard*>{}; }), op,
      [&] {
        return &store_duration_->add({{"store", store}, {"op", op}});
      });
  shard->observe(seconds(duration));
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

void Metrics::h2_connection_opened() {
  h2_connections_.Increment();
}

void Metrics::h2_connection_closed() {
  h2_connections_.Decrement();
}

void Metrics::count_h2_stream() {
  h2_streams_.Increment();
}

void Metrics::count_h2_cut(std::string_view reason) {
  h2_cuts_.Add({{"reason", std::string(reason)}}).Increment();
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
  auto families = registry_->Collect();
  for (const auto* sharded : {requests_.get(), upstream_duration_.get(), store_duration_.get()}) {
    families.push_back(sharded->collect());
  }
  prometheus::TextSerializer().Serialize(out, families);
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
