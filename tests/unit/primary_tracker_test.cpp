// core::PrimaryTracker: the process-wide record of the primary in use per store (SPEC C46).
#define BOOST_TEST_MODULE primary_tracker
#include "gateway/core/primary_tracker.hpp"

#include <boost/test/unit_test.hpp>
#include <string>
#include <thread>
#include <vector>

using idemgate::core::PrimaryTracker;

namespace {

struct Recorder {
  std::vector<std::string> switches;
  PrimaryTracker::OnSwitch callback() {
    return [this](const std::string& from, const std::string& to) {
      switches.push_back(from + " > " + to);
    };
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C46_the_first_primary_is_not_a_switch_nor_is_the_same_one_again) {
  Recorder recorder;
  PrimaryTracker tracker(recorder.callback());
  tracker.use("", "127.0.0.1:5432");
  tracker.use("", "127.0.0.1:5432");
  BOOST_TEST(tracker.switches() == 0u);
  BOOST_TEST(recorder.switches.empty());
}

BOOST_AUTO_TEST_CASE(spec_C46_each_move_to_another_primary_is_one_switch_with_from_and_to) {
  Recorder recorder;
  PrimaryTracker tracker(recorder.callback());
  tracker.use("", "127.0.0.1:5432");
  tracker.use("", "127.0.0.1:5433");
  tracker.use("", "127.0.0.1:5433");  // another connection meeting the new primary
  tracker.use("", "127.0.0.1:5432");  // the old primary back, promoted again
  BOOST_TEST(tracker.switches() == 2u);
  BOOST_TEST(recorder.switches == (std::vector<std::string>{"127.0.0.1:5432 > 127.0.0.1:5433",
                                                            "127.0.0.1:5433 > 127.0.0.1:5432"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(spec_C46_scopes_are_tracked_apart) {
  Recorder recorder;
  PrimaryTracker tracker(recorder.callback());
  tracker.use("0", "10.0.0.1:7000");
  tracker.use("5461", "10.0.0.2:7000");  // a new scope: its first primary, not a switch
  BOOST_TEST(tracker.switches() == 0u);
  tracker.use("5461", "10.0.0.3:7000");
  BOOST_TEST(tracker.switches() == 1u);
  BOOST_TEST(recorder.switches == std::vector<std::string>{"10.0.0.2:7000 > 10.0.0.3:7000"},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(spec_C46_threads_meeting_the_same_new_primary_count_one_switch) {
  Recorder recorder;
  PrimaryTracker tracker(recorder.callback());
  tracker.use("", "old:1");
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int n = 0; n < 100; ++n) tracker.use("", "new:2");
    });
  }
  for (auto& t : threads) t.join();
  BOOST_TEST(tracker.switches() == 1u);
  BOOST_TEST(recorder.switches == std::vector<std::string>{"old:1 > new:2"},
             boost::test_tools::per_element());
}
