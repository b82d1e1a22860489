#include "tests/support/keyed_load.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>

namespace idemgate::test {
namespace {

// Failures described in full before the rest are only counted.
constexpr int kFailuresInFull = 5;

// Records failures: the first kFailuresInFull with their description, then a count.
class FailureReport {
 public:
  void add(const std::string& what) {
    if (count_++ < kFailuresInFull) BOOST_TEST(false, what);
  }
  /// Reports how many failures were not described (`what`); true when anything failed.
  bool finish(const std::string& what) const {
    if (count_ > kFailuresInFull) BOOST_TEST(false, count_ - kFailuresInFull << " more " << what);
    return count_ > 0;
  }

 private:
  int count_ = 0;
};

}  // namespace

KeyedLoad::Options KeyedLoad::on(const e2e::Gateway& gateway,
                                 std::function<HttpRequest()> new_request) {
  Options options;
  options.new_request = std::move(new_request);
  options.send = [&gateway](const HttpRequest& request, int instance) {
    return send_timed(gateway, request, instance);
  };
  options.instances = gateway.instances();
  return options;
}

KeyedLoad::KeyedLoad(Options options) : options_(std::move(options)) {}

KeyedLoad::~KeyedLoad() {
  stop();
}

void KeyedLoad::start() {
  for (int t = 0; t < options_.threads; ++t) threads_.emplace_back([this, t] { run(t); });
}

void KeyedLoad::stop() {
  stopping_ = true;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void KeyedLoad::run(int thread) {
  const int instance = thread % options_.instances;
  while (!stopping_) {
    KeyRecord record;
    record.request = options_.new_request();
    record.answers.push_back(options_.send(record.request, instance));
    if (options_.retry_elsewhere && record.answers.back().answered()) {
      record.answers.push_back(options_.send(record.request, (instance + 1) % options_.instances));
    }
    {
      std::lock_guard lock(mutex_);
      records_.push_back(std::move(record));
    }
    if (options_.pace != Clock::duration::zero()) std::this_thread::sleep_for(options_.pace);
  }
}

std::size_t KeyedLoad::count(const std::function<bool(const Timed&)>& which) const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (const auto& r : records_)
    for (const auto& a : r.answers) n += which(a);
  return n;
}

std::size_t KeyedLoad::executions() const {
  return count([](const Timed& a) { return a.answered() && executed(a.response); });
}

std::size_t KeyedLoad::answers_of_kind(const std::string& kind, Clock::time_point after) const {
  return count([&](const Timed& a) { return a.start >= after && kind_of(a) == kind; });
}

std::size_t KeyedLoad::successes_after(Clock::time_point after) const {
  return count([&](const Timed& a) { return a.start > after && success(a.response); });
}

std::optional<Clock::time_point> KeyedLoad::first_execution(int instance,
                                                            Clock::time_point after) const {
  std::lock_guard lock(mutex_);
  std::optional<Clock::time_point> first;
  for (const auto& r : records_) {
    for (const auto& a : r.answers) {
      if (a.instance != instance || a.start < after || !a.answered() || !executed(a.response))
        continue;
      if (!first || a.done < *first) first = a.done;
    }
  }
  return first;
}

bool KeyedLoad::wait_for_executions(std::size_t n) const {
  return eventually([&] { return executions() >= n; });
}

std::vector<std::optional<Clock::time_point>> KeyedLoad::wait_for_recovery(
    Clock::time_point after) const {
  std::vector<std::optional<Clock::time_point>> first(options_.instances);
  eventually_by(after + kEventDeadline, [&] {
    bool all = true;
    for (int i = 0; i < options_.instances; ++i) {
      if (!first[i]) first[i] = first_execution(i, after);
      all &= first[i].has_value();
    }
    return all;
  });
  return first;
}

LoadTally check_answers(const std::vector<KeyRecord>& records, const e2e::Gateway& gateway,
                        const AnswerChecks& checks) {
  LoadTally tally;
  FailureReport failures;
  for (const auto& record : records) {
    const Timed* first_success = nullptr;
    for (const auto& a : record.answers) {
      const std::string kind = kind_of(a);
      ++tally.kinds[kind];
      tally.slowest_ms = std::max(tally.slowest_ms, ms(a.elapsed()));
      const bool succeeded = a.answered() && success(a.response);
      if (!allowed_kind(kind)) {
        failures.add("answer of kind " + kind + " on instance " + std::to_string(a.instance) +
                     ": " + a.error + "\n" + e2e::describe(a.response));
      } else if (checks.bound && a.elapsed() > *checks.bound) {
        failures.add("answered after " + std::to_string(ms(a.elapsed())) +
                     " ms, beyond the SPEC bound of " + std::to_string(ms(*checks.bound)) + " ms");
      } else if (checks.later_successes_replay_the_first && succeeded && first_success &&
                 (!replayed(a.response) || a.response.body != first_success->response.body)) {
        failures.add("a later 2xx answer is not the replay of the first one; first:\n" +
                     e2e::describe(first_success->response) + "\nlater:\n" +
                     e2e::describe(a.response));
      }
      if (succeeded && !first_success) first_success = &a;
    }
    tally.keys_answered_2xx += first_success != nullptr;
  }
  if (failures.finish("answers failed these checks")) BOOST_TEST_MESSAGE(gateway.diagnostics());
  return tally;
}

std::size_t check_replays(const std::vector<KeyRecord>& records, const e2e::Gateway& gateway) {
  std::size_t checked = 0;
  FailureReport failures;
  for (const auto& record : records) {
    const auto first =
        std::find_if(record.answers.begin(), record.answers.end(),
                     [](const Timed& a) { return a.answered() && success(a.response); });
    if (first == record.answers.end()) continue;
    ++checked;
    const Timed again =
        send_timed(gateway, record.request, (first->instance + 1) % gateway.instances());
    const bool same = again.answered() && replayed(again.response) &&
                      again.response.status == first->response.status &&
                      again.response.body == first->response.body;
    if (!same) {
      failures.add("the retry of an answered key is not the replay of its first answer; first:\n" +
                   e2e::describe(first->response) + "\nretry: " + again.error + "\n" +
                   e2e::describe(again.response));
    }
  }
  failures.finish("answered keys did not replay");
  return checked;
}

void warm_up(const e2e::Gateway& gateway, const std::function<HttpRequest()>& new_request) {
  for (int i = 0; i < gateway.instances(); ++i) {
    const Timed t = send_timed(gateway, new_request(), i);
    BOOST_REQUIRE_MESSAGE(t.answered(), "warm-up on instance " << i << ": " << t.error << "\n"
                                                               << gateway.diagnostics());
    BOOST_REQUIRE_MESSAGE(executed(t.response), "warm-up on instance "
                                                    << i << " did not execute:\n"
                                                    << gateway.explain(t.response));
  }
}

}  // namespace idemgate::test
