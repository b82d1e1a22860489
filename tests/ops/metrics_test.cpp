// Metrics (SPEC C31) without a network: names and labels in the text format, and the
// in-flight-locks gauge kept by the timing decorator over the in-memory lock.
#define BOOST_TEST_MODULE metrics
#include "gateway/metrics.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/test/unit_test.hpp>
#include <memory>
#include <thread>

#include "tests/fakes/memory_lock.hpp"
#include "tests/support/metric_text.hpp"

namespace idemgate {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
// The sample's value, or -1 when it is missing (Boost.Test cannot print an optional).
double metric_value(const std::string& text, const std::string& name,
                    const std::map<std::string, std::string>& labels = {}) {
  return test::metric_value(text, name, labels).value_or(-1);
}

template <class T>
T run(asio::io_context& io, asio::awaitable<T> op) {
  auto future = asio::co_spawn(io, std::move(op), asio::use_future);
  io.restart();
  while (future.wait_for(0s) != std::future_status::ready) io.run_one();
  return future.get();
}

core::Sha256 id_of(std::uint8_t n) {
  core::Sha256 id{};
  id[0] = n;
  return id;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C31_every_metric_is_exported_under_its_spec_name) {
  Metrics metrics;
  metrics.count_request("pay", "executed");
  metrics.count_request("pay", "executed");
  metrics.count_request("", "no_route");
  metrics.observe_upstream("pay", 1500us);
  metrics.observe_store("postgres", "find", 2ms);
  metrics.count_lock_contention();
  metrics.count_duplicate_execution();
  metrics.count_record_commit_failure();
  metrics.connection_opened();
  std::uint64_t cleaned = 7;
  metrics.set_cleanup_source([&cleaned] { return cleaned; });

  std::string text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "executed"}}) == 2.0);
  BOOST_TEST(metric_value(text, "idemgate_requests_total",
                          {{"route", ""}, {"outcome", "no_route"}}) == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_upstream_duration_seconds_count", {{"route", "pay"}}) ==
             1.0);
  BOOST_TEST(metric_value(text, "idemgate_upstream_duration_seconds_sum", {{"route", "pay"}}) ==
             0.0015);
  BOOST_TEST(metric_value(text, "idemgate_store_duration_seconds_bucket",
                          {{"store", "postgres"}, {"op", "find"}, {"le", "0.0025"}}) == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_store_duration_seconds_bucket",
                          {{"store", "postgres"}, {"op", "find"}, {"le", "0.001"}}) == 0.0);
  BOOST_TEST(metric_value(text, "idemgate_lock_contention_total") == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_duplicate_executions_total") == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_record_commit_failures_total") == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_client_connections") == 1.0);
  BOOST_TEST(metric_value(text, "idemgate_cleanup_deleted_total") == 7.0);
  BOOST_TEST(text.find("# TYPE idemgate_requests_total counter") != std::string::npos, text);
  BOOST_TEST(text.find("# TYPE idemgate_store_duration_seconds histogram") != std::string::npos);

  // The cleanup counter follows the cleaner's total without counting twice.
  cleaned = 10;
  text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_cleanup_deleted_total") == 10.0);
  text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_cleanup_deleted_total") == 10.0);
}

BOOST_AUTO_TEST_CASE(spec_C31_readiness_and_cleaner_progress_are_exported_for_alerts) {
  Metrics metrics;
  std::string text = metrics.render();
  // Not ready until a check passed; no cleaner series before a cleaner is attached.
  BOOST_TEST(metric_value(text, "idemgate_ready") == 0.0);
  BOOST_TEST(metric_value(text, "idemgate_cleaner_last_run_timestamp_seconds") == -1.0);
  BOOST_TEST(metric_value(text, "idemgate_cleaner_interval_seconds") == -1.0);

  metrics.set_ready(true);
  BOOST_TEST(metric_value(metrics.render(), "idemgate_ready") == 1.0);
  metrics.set_ready(false);
  BOOST_TEST(metric_value(metrics.render(), "idemgate_ready") == 0.0);

  double last_run = 1700000000.5;
  metrics.set_cleaner_source([&last_run] { return last_run; }, 90s);
  text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_cleaner_last_run_timestamp_seconds") == 1700000000.5);
  BOOST_TEST(metric_value(text, "idemgate_cleaner_interval_seconds") == 90.0);
  BOOST_TEST(text.find("# TYPE idemgate_cleaner_last_run_timestamp_seconds gauge") !=
             std::string::npos);
  // Read at each render: the gauge follows the cleaner.
  last_run = 1700000060.25;
  text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_cleaner_last_run_timestamp_seconds") == 1700000060.25);
  // Detached (shutdown): the last value read stays.
  metrics.set_cleaner_source(nullptr, 90s);
  last_run = 0;
  BOOST_TEST(metric_value(metrics.render(), "idemgate_cleaner_last_run_timestamp_seconds") ==
             1700000060.25);
}

BOOST_AUTO_TEST_CASE(observations_land_in_their_own_registry_from_any_thread) {
  // Each thread keeps the children it has looked up: several registries used by the same
  // threads, in turn, must each still see exactly their own observations.
  auto a = std::make_unique<Metrics>();
  Metrics b;
  const auto observe = [&] {
    for (int i = 0; i < 100; ++i) {
      a->count_request("pay", "executed");
      b.count_request("pay", "executed");
      b.count_request("pay", "replayed");
      a->observe_upstream("pay", 1ms);
      b.observe_store("redis", "renew", 1ms);
    }
  };
  std::thread other(observe);
  observe();
  other.join();
  const std::string text_a = a->render();
  const std::string text_b = b.render();
  BOOST_TEST(metric_value(text_a, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "executed"}}) == 200.0);
  BOOST_TEST(metric_value(text_a, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "replayed"}}) == -1.0);
  BOOST_TEST(metric_value(text_a, "idemgate_upstream_duration_seconds_count", {{"route", "pay"}}) ==
             200.0);
  BOOST_TEST(metric_value(text_b, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "executed"}}) == 200.0);
  BOOST_TEST(metric_value(text_b, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "replayed"}}) == 200.0);
  BOOST_TEST(metric_value(text_b, "idemgate_store_duration_seconds_count",
                          {{"store", "redis"}, {"op", "renew"}}) == 200.0);
  BOOST_TEST(metric_value(text_b, "idemgate_upstream_duration_seconds_count", {{"route", "pay"}}) ==
             -1.0);

  // A registry made after another was destroyed (maybe at the same address) starts empty.
  a.reset();
  a = std::make_unique<Metrics>();
  a->count_request("pay", "executed");
  BOOST_TEST(metric_value(a->render(), "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "executed"}}) == 1.0);
}

BOOST_AUTO_TEST_CASE(a_scrape_during_observations_adds_the_threads_up_consistently) {
  // Each thread writes numbers of its own; a render made meanwhile sums them. Every sample it
  // shows must be a valid histogram (buckets cumulative, +Inf equal to _count) and no count
  // may go down from one render to the next; after the threads end, the totals are exact.
  Metrics metrics;
  constexpr int kPerThread = 20000;
  const auto observe = [&metrics] {
    for (int i = 0; i < kPerThread; ++i) {
      metrics.observe_store("redis", "renew", std::chrono::microseconds(i % 2 == 0 ? 200 : 3000));
      metrics.count_request("pay", "executed");
    }
  };
  std::thread first(observe);
  std::thread second(observe);
  const std::map<std::string, std::string> renew{{"store", "redis"}, {"op", "renew"}};
  const auto bucket = [&renew](const std::string& text, const std::string& le) {
    auto labels = renew;
    labels["le"] = le;
    return metric_value(text, "idemgate_store_duration_seconds_bucket", labels);
  };
  double last_count = 0;
  double last_requests = 0;
  for (int scrape = 0; scrape < 50; ++scrape) {
    const std::string text = metrics.render();
    const double count = metric_value(text, "idemgate_store_duration_seconds_count", renew);
    if (count < 0) continue;  // no observation yet
    BOOST_TEST(bucket(text, "+Inf") == count);
    BOOST_TEST(bucket(text, "0.0005") <= bucket(text, "0.005"));
    BOOST_TEST(bucket(text, "0.005") <= bucket(text, "+Inf"));
    BOOST_TEST(count >= last_count);
    last_count = count;
    // A thread may have observed its first duration but not yet counted its first request.
    const double requests = test::metric_value(text, "idemgate_requests_total",
                                               {{"route", "pay"}, {"outcome", "executed"}})
                                .value_or(0);
    BOOST_TEST(requests >= last_requests);
    last_requests = requests;
  }
  first.join();
  second.join();
  const std::string text = metrics.render();
  BOOST_TEST(metric_value(text, "idemgate_store_duration_seconds_count", renew) ==
             2.0 * kPerThread);
  BOOST_TEST(bucket(text, "0.0005") == 1.0 * kPerThread);  // the 200 µs half
  BOOST_TEST(bucket(text, "0.0025") == 1.0 * kPerThread);
  BOOST_TEST(bucket(text, "0.005") == 2.0 * kPerThread);  // and the 3 ms half
  BOOST_TEST(metric_value(text, "idemgate_store_duration_seconds_sum", renew) ==
                 kPerThread * (0.0002 + 0.003),
             boost::test_tools::tolerance(1e-9));
  BOOST_TEST(metric_value(text, "idemgate_requests_total",
                          {{"route", "pay"}, {"outcome", "executed"}}) == 2.0 * kPerThread);
}

BOOST_AUTO_TEST_CASE(in_flight_locks_rise_on_acquire_and_fall_on_release_or_loss) {
  asio::io_context io;
  Metrics metrics;
  testing::MemoryLock inner;
  TimedLockService lock(inner, metrics);
  auto gauge = [&] { return metric_value(metrics.render(), "idemgate_in_flight_locks"); };

  BOOST_TEST(run(io, lock.try_acquire(id_of(1), "a", 30s)).value());
  BOOST_TEST(run(io, lock.try_acquire(id_of(2), "b", 30s)).value());
  BOOST_TEST(!run(io, lock.try_acquire(id_of(1), "c", 30s)).value());  // contention: not ours
  BOOST_TEST(gauge() == 2.0);
  BOOST_TEST(run(io, lock.release(id_of(1), "a")).value());
  BOOST_TEST(gauge() == 1.0);

  // A renew that finds the lock gone means this process no longer holds it.
  inner.drop(id_of(2));
  BOOST_TEST(!run(io, lock.renew(id_of(2), "b", 30s)).value());
  BOOST_TEST(gauge() == 0.0);
  BOOST_TEST(metric_value(metrics.render(), "idemgate_store_duration_seconds_count",
                          {{"store", "redis"}, {"op", "try_acquire"}}) == 3.0);
}

BOOST_AUTO_TEST_CASE(a_lock_kept_on_purpose_leaves_the_gauge_when_its_ttl_ends) {
  asio::io_context io;
  Metrics metrics;
  testing::MemoryLock inner;
  {
    TimedLockService lock(inner, metrics);
    BOOST_TEST(run(io, lock.try_acquire(id_of(3), "held", 20ms)).value());
    BOOST_TEST(metric_value(metrics.render(), "idemgate_in_flight_locks") == 1.0);
    // Nothing releases it (C22 hold, C26): the ttl timer is the only work left.
    io.restart();
    io.run();
    BOOST_TEST(metric_value(metrics.render(), "idemgate_in_flight_locks") == 0.0);
  }
  BOOST_TEST(metric_value(metrics.render(), "idemgate_in_flight_locks") == 0.0);
}

}  // namespace idemgate
