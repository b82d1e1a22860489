#define BOOST_TEST_MODULE overload
#include <boost/test/unit_test.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gateway/config/config_loader.hpp"
#include "gateway/descriptor_budget.hpp"
#include "gateway/http/admission.hpp"
#include "gateway/http/connection_gate.hpp"
#include "gateway/http/header_deadlines.hpp"
#include "tests/support/config_text.hpp"

// SPEC §7 without a network: the keys of C52-C54 (defaults, and every bad value refused with
// `FILE:LINE: key.path: problem`), the default of max_connections from the descriptor limit, and
// the counting behind the acceptor's pauses and the shedding of requests and tunnels.

namespace cfg = idemgate::config;
using idemgate::http::Admission;
using idemgate::http::ConnectionGate;
using idemgate::http::HeaderDeadlines;
using idemgate::http::SlowHeader;

namespace {

// Lines 1-9; a test appends `limits:` (line 10) or replaces parts.
const std::string& kBase = idemgate::test::kMinimalConfig;

// The shared loader helpers (tests/support/config_text.hpp) under the names used here.
constexpr auto& load = idemgate::test::load_config_text;
constexpr auto& error_of = idemgate::test::config_error_of;

std::string with_postgres(const std::string& entries) {
  std::string text = kBase;
  const std::string from = "dsn: \"postgresql://idem@127.0.0.1:5432/idem\" }";
  return text.replace(text.find(from), from.size(),
                      "dsn: \"postgresql://idem@127.0.0.1:5432/idem\", " + entries + " }");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(keys)

BOOST_AUTO_TEST_CASE(spec_C52_C53_C54_new_limits_have_their_defaults) {
  const auto c = load(kBase);
  BOOST_TEST(c->limits.max_connections == 0u);  // derived from RLIMIT_NOFILE at start
  BOOST_TEST(c->limits.max_tunnels == 10000u);
  BOOST_TEST(c->storage.postgres.max_pending == 10000u);
  BOOST_TEST(c->routes.at(0).max_in_flight == 0u);  // no bound
}

BOOST_AUTO_TEST_CASE(spec_C52_C53_C54_new_limits_are_read) {
  const auto c = load(with_postgres("max_pending: 16") + "    max_in_flight: 8\n" +
                      "limits: { max_connections: 500, max_tunnels: 0 }\n");
  BOOST_TEST(c->limits.max_connections == 500u);
  BOOST_TEST(c->limits.max_tunnels == 0u);
  BOOST_TEST(c->storage.postgres.max_pending == 16u);
  BOOST_TEST(c->routes.at(0).max_in_flight == 8u);
}

BOOST_AUTO_TEST_CASE(
    spec_C52_bad_connection_and_tunnel_limits_are_refused_naming_file_line_and_key) {
  BOOST_TEST(error_of(kBase + "limits: { max_connections: 0 }\n") ==
             "t.yaml:10: limits.max_connections: must be between 1 and 1000000, got 0");
  BOOST_TEST(error_of(kBase + "limits: { max_connections: 1000001 }\n") ==
             "t.yaml:10: limits.max_connections: must be between 1 and 1000000, got 1000001");
  BOOST_TEST(error_of(kBase + "limits: { max_connections: many }\n") ==
             "t.yaml:10: limits.max_connections: expected an integer, got \"many\"");
  BOOST_TEST(error_of(kBase + "limits: { max_connections: -5 }\n") ==
             "t.yaml:10: limits.max_connections: must be between 1 and 1000000, got -5");
  BOOST_TEST(error_of(kBase + "limits: { max_tunnels: -1 }\n") ==
             "t.yaml:10: limits.max_tunnels: must be between 0 and 1000000, got -1");
  BOOST_TEST(error_of(kBase + "limits: { max_tunnels: 2000000 }\n") ==
             "t.yaml:10: limits.max_tunnels: must be between 0 and 1000000, got 2000000");
  BOOST_TEST(error_of(kBase + "limits: { max_tunnels: 1.5 }\n") ==
             "t.yaml:10: limits.max_tunnels: expected an integer, got \"1.5\"");
  BOOST_TEST(error_of(kBase + "limits: { max_conections: 10 }\n")
                 .starts_with("t.yaml:10: limits.max_conections: unknown key"));
}

BOOST_AUTO_TEST_CASE(spec_C53_bad_max_in_flight_is_refused_naming_file_line_and_key) {
  BOOST_TEST(error_of(kBase + "    max_in_flight: 0\n") ==
             "t.yaml:10: routes[0].max_in_flight: must be between 1 and 1000000, got 0");
  BOOST_TEST(error_of(kBase + "    max_in_flight: 1000001\n") ==
             "t.yaml:10: routes[0].max_in_flight: must be between 1 and 1000000, got 1000001");
  BOOST_TEST(error_of(kBase + "    max_in_flight: eight\n") ==
             "t.yaml:10: routes[0].max_in_flight: expected an integer, got \"eight\"");
  BOOST_TEST(error_of(kBase + "    max_in_flight:\n") ==
             "t.yaml:10: routes[0].max_in_flight: expected a single value, got an empty value");
}

BOOST_AUTO_TEST_CASE(spec_C54_bad_max_pending_is_refused_naming_file_line_and_key) {
  BOOST_TEST(error_of(with_postgres("max_pending: 0")) ==
             "t.yaml:3: storage.postgres.max_pending: must be between 1 and 1000000, got 0");
  BOOST_TEST(error_of(with_postgres("max_pending: 1000001")) ==
             "t.yaml:3: storage.postgres.max_pending: must be between 1 and 1000000, got 1000001");
  BOOST_TEST(error_of(with_postgres("max_pending: 10k")) ==
             "t.yaml:3: storage.postgres.max_pending: expected an integer, got \"10k\"");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(descriptor_budget)

BOOST_AUTO_TEST_CASE(spec_C52_default_max_connections_leaves_room_for_upstream_and_store_sides) {
  // threads 2, pool_size 8, one Redis, one upstream with max_idle_connections 64 (the defaults).
  auto c = std::make_shared<cfg::Config>(*load(kBase + "threads: 2\n"));
  // 32 + 4 × 2 + 24 (process, io threads, admin) + 2 × (8 + 1) (Postgres: libpq's socket and
  // the event loop's duplicate) + 2 (Redis) + 128 (idle).
  const auto budget = idemgate::descriptor_budget(*c, 1024);
  BOOST_TEST(budget.reserved == 32u + 8u + 24u + 18u + 2u + 128u);
  // Each client connection may need an upstream connection at the same time.
  BOOST_TEST(budget.max_connections == (1024u - budget.reserved) / 2u);
  BOOST_TEST(2 * budget.max_connections + budget.reserved <= 1024u);

  // Every pool and every idle upstream connection is taken off.
  c->upstreams["other"] = c->upstreams.at("app");
  c->storage.postgres.pool_size = 16;
  c->storage.redis.wait_replicas = 1;
  const auto bigger = idemgate::descriptor_budget(*c, 1024);
  BOOST_TEST(bigger.reserved == budget.reserved + 128u + 2u * 8u + 2u);

  // A limit that leaves nothing still admits one connection (the gateway warns at start).
  BOOST_TEST(idemgate::descriptor_budget(*c, 64).max_connections == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gate)

BOOST_AUTO_TEST_CASE(spec_C52_slots_run_out_at_max_connections_and_come_back_on_close) {
  ConnectionGate gate(2);
  BOOST_TEST(gate.try_take());
  BOOST_TEST(gate.try_take());
  BOOST_TEST(!gate.try_take());
  BOOST_TEST(gate.taken() == 2u);
  gate.give_back();
  BOOST_TEST(gate.try_take());
  BOOST_TEST(gate.taken() == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C52_a_parked_acceptor_is_woken_by_a_close_and_paused_time_counts) {
  ConnectionGate gate(1);
  BOOST_REQUIRE(gate.try_take());
  int woken = 0;
  const int acceptor = 0;
  BOOST_TEST(!gate.take_or_park(&acceptor, [&] { ++woken; }));  // parked, nothing taken
  BOOST_TEST(gate.taken() == 1u);
  BOOST_TEST(gate.paused_seconds() > 0.0);  // the clock runs while an acceptor is parked
  gate.give_back();                         // a connection closed
  BOOST_TEST(woken == 1);
  const double paused = gate.paused_seconds();
  BOOST_TEST(gate.paused_seconds() == paused);  // no acceptor parked: the count stands still
  BOOST_TEST(gate.take_or_park(&acceptor, [&] { ++woken; }));  // a slot is free: taken at once
  gate.give_back();
  BOOST_TEST(woken == 1);  // it was not parked
}

BOOST_AUTO_TEST_CASE(spec_C52_an_acceptor_out_of_descriptors_parks_until_a_close_or_its_timer) {
  ConnectionGate gate(0);  // no bound: only EMFILE pauses
  const int acceptor = 0;
  int woken = 0;
  gate.park(&acceptor, [&] { ++woken; });
  gate.unpark(&acceptor);  // its backoff timer ran out first
  BOOST_REQUIRE(gate.try_take());
  gate.give_back();
  BOOST_TEST(woken == 0);
  gate.park(&acceptor, [&] { ++woken; });
  BOOST_REQUIRE(gate.try_take());
  gate.give_back();
  BOOST_TEST(woken == 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(admission)

BOOST_AUTO_TEST_CASE(spec_C53_a_route_admits_max_in_flight_requests_then_sheds) {
  Admission admission;
  cfg::Route route;
  route.name = "pay";
  route.max_in_flight = 2;
  auto a = admission.enter(route);
  auto b = admission.enter(route);
  auto c = admission.enter(route);
  BOOST_TEST(static_cast<bool>(a));
  BOOST_TEST(static_cast<bool>(b));
  BOOST_TEST(!static_cast<bool>(c));
  BOOST_TEST(admission.in_flight("pay") == 2u);
  a = Admission::Ticket();  // one answered
  BOOST_TEST(admission.in_flight("pay") == 1u);
  auto d = admission.enter(route);
  BOOST_TEST(static_cast<bool>(d));

  // The count belongs to the route's name: a reloaded route of that name shares it.
  cfg::Route reloaded = route;
  BOOST_TEST(!static_cast<bool>(admission.enter(reloaded)));

  // A route without max_in_flight is never shed and counts nothing.
  cfg::Route open;
  open.name = "open";
  for (int i = 0; i < 100; ++i) BOOST_TEST(static_cast<bool>(admission.enter(open)));
  BOOST_TEST(admission.in_flight("open") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C52_tunnels_past_max_tunnels_are_refused) {
  Admission admission;
  auto one = admission.open_tunnel(1);
  BOOST_TEST(static_cast<bool>(one));
  BOOST_TEST(!static_cast<bool>(admission.open_tunnel(1)));
  BOOST_TEST(admission.tunnels() == 1u);
  Admission::Ticket moved = std::move(one);
  BOOST_TEST(admission.tunnels() == 1u);  // moved, not released
  moved = Admission::Ticket();
  BOOST_TEST(admission.tunnels() == 0u);
  BOOST_TEST(!static_cast<bool>(admission.open_tunnel(0)));  // max_tunnels 0: no upgrades
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(header_deadlines)

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

asio::ip::tcp::socket open_socket(asio::io_context& io) {
  asio::ip::tcp::socket socket(io);
  socket.open(asio::ip::tcp::v4());
  return socket;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C07_C54_slow_headers_are_closed_at_their_deadline_unless_removed) {
  asio::io_context io;
  HeaderDeadlines deadlines(io.get_executor());
  auto late = open_socket(io), early = open_socket(io), done = open_socket(io);
  const auto now = HeaderDeadlines::Clock::now();
  SlowHeader late_entry(late, now + 40ms);
  SlowHeader early_entry(early, now + 10ms);  // earlier: the timer is re-armed
  SlowHeader done_entry(done, now + 5ms);
  HeaderDeadlines::Guard late_guard(deadlines, late_entry);
  HeaderDeadlines::Guard early_guard(deadlines, early_entry);
  {
    HeaderDeadlines::Guard done_guard(deadlines, done_entry);
    BOOST_TEST(deadlines.size() == 3u);
  }  // its header arrived in time
  BOOST_TEST(deadlines.size() == 2u);
  io.run();  // returns once nothing is left to time
  BOOST_TEST(!late.is_open());
  BOOST_TEST(!early.is_open());
  BOOST_TEST(done.is_open());
  BOOST_TEST(deadlines.expired() == 2u);
  BOOST_TEST(deadlines.size() == 0u);
  BOOST_TEST((HeaderDeadlines::Clock::now() >= now + 40ms));  // never before the deadline
}

BOOST_AUTO_TEST_CASE(spec_C07_C54_a_deadline_ahead_leaves_its_connection_open) {
  asio::io_context io;
  HeaderDeadlines deadlines(io.get_executor());
  auto waiting = open_socket(io), past = open_socket(io);
  const auto now = HeaderDeadlines::Clock::now();
  SlowHeader waiting_entry(waiting, now + 1h);
  SlowHeader past_entry(past, now - 1ms);
  HeaderDeadlines::Guard waiting_guard(deadlines, waiting_entry);
  HeaderDeadlines::Guard past_guard(deadlines, past_entry);
  io.run_for(50ms);
  BOOST_TEST(!past.is_open());
  BOOST_TEST(waiting.is_open());
  BOOST_TEST(deadlines.expired() == 1u);
  BOOST_TEST(deadlines.size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

// The per-thread deadline list itself, as the lock renewals use it (C23): an entry that makes
// itself due again, and a list left empty that stops timing.
BOOST_AUTO_TEST_SUITE(deadline_list)

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using idemgate::common::DeadlineList;

/// Due `times` times, `every` apart, adding itself again from its callback.
struct Repeating : DeadlineList::Entry {
  Repeating(DeadlineList& owner, int n) : list(owner), times(n) {
    deadline = DeadlineList::Clock::now() + every;
    on_due = [](DeadlineList::Entry& entry) {
      auto& self = static_cast<Repeating&>(entry);
      self.seen.push_back(DeadlineList::Clock::now());
      if (static_cast<int>(self.seen.size()) < self.times) {
        self.deadline = DeadlineList::Clock::now() + self.every;
        self.list.add(self);
      }
    };
  }
  DeadlineList& list;
  int times;
  std::chrono::milliseconds every{5ms};
  std::vector<DeadlineList::Clock::time_point> seen;
};

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C23_an_entry_added_again_from_its_callback_is_due_at_each_deadline) {
  asio::io_context io;
  DeadlineList list(io.get_executor());
  const auto start = DeadlineList::Clock::now();
  Repeating renewal(list, 3);
  DeadlineList::Guard guard(list, renewal);
  io.run();  // returns once the entry stops adding itself: nothing is left to time
  BOOST_TEST_REQUIRE(renewal.seen.size() == 3u);
  BOOST_TEST(list.expired() == 3u);
  BOOST_TEST(list.size() == 0u);
  // Each call comes no earlier than its deadline, one interval after the one before.
  BOOST_TEST((renewal.seen[0] >= start + renewal.every));
  BOOST_TEST((renewal.seen[1] >= renewal.seen[0] + renewal.every));
  BOOST_TEST((renewal.seen[2] >= renewal.seen[1] + renewal.every));
}

BOOST_AUTO_TEST_CASE(removing_the_last_entry_stops_the_timer) {
  asio::io_context io;
  DeadlineList list(io.get_executor());
  Repeating far(list, 1);
  far.deadline = DeadlineList::Clock::now() + 1h;
  {
    DeadlineList::Guard guard(list, far);
    BOOST_TEST(list.size() == 1u);
  }
  io.poll();  // runs the cancelled wait; with the timer still armed the context would have work
  BOOST_TEST(io.stopped());
  BOOST_TEST(far.seen.empty());
  BOOST_TEST(list.expired() == 0u);
}

BOOST_AUTO_TEST_CASE(removing_the_last_entry_due_soon_leaves_the_timer_for_one_wake) {
  // Entries that come and go one at a time (a quick exchange's clock) cost no cancel and re-arm
  // each: a timer due within kLinger stays armed and fires once, for nothing.
  asio::io_context io;
  DeadlineList list(io.get_executor());
  Repeating soon(list, 1);
  soon.deadline = DeadlineList::Clock::now() + 20ms;
  { DeadlineList::Guard guard(list, soon); }
  io.poll();
  BOOST_TEST(!io.stopped());  // the wait is still pending
  io.run();                   // it fires and finds nothing due
  BOOST_TEST(soon.seen.empty());
  BOOST_TEST(list.expired() == 0u);
}

BOOST_AUTO_TEST_CASE(an_entry_outliving_its_list_is_left_unlinked) {
  asio::io_context io;
  Repeating* entry = nullptr;
  auto list = std::make_unique<DeadlineList>(io.get_executor());
  Repeating late(*list, 1);
  entry = &late;
  late.deadline = DeadlineList::Clock::now() + 1h;
  {
    DeadlineList::Guard guard(*list, late);
    list.reset();  // a shutdown destroys the list before the frames that hold entries
    BOOST_TEST(!entry->is_linked());
  }  // the guard leaves the destroyed list alone (ASan would report a use after free)
}

BOOST_AUTO_TEST_SUITE_END()
