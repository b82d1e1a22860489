#define BOOST_TEST_MODULE idempotency_filter
#include "gateway/core/idempotency_filter.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gateway/core/fingerprint.hpp"
#include "gateway/core/replay_marker.hpp"
#include "tests/fakes/memory_lock.hpp"
#include "tests/fakes/memory_record_store.hpp"

namespace asio = boost::asio;
using namespace idemgate::core;
using idemgate::testing::MemoryLock;
using idemgate::testing::MemoryRecordStore;
using namespace std::chrono_literals;

namespace {

struct Fixture {
  asio::io_context io;
  MemoryRecordStore store;
  MemoryLock lock;
  int duplicates = 0;
  int contention = 0;
  int commit_failures = 0;
  std::vector<std::string> store_errors;
  std::vector<std::string> task_failures;
  IdempotencyFilter filter{
      store, lock,
      FilterEvents{[this] { ++contention; },
                   [this] { ++duplicates; },
                   [this] { ++commit_failures; },
                   [this](const char* what, const boost::system::error_code&) {
                     store_errors.emplace_back(what);
                   },
                   [this](const char* what, const std::string& detail) {
                     task_failures.push_back(std::string(what) + ": " + detail);
                   },
                   {}}};
  RoutePolicy policy;
  int executions = 0;

  KeyedRequest request(std::string_view key, std::string_view body = "{}") {
    const Sha256 scope = compute_scope("payments", {});
    return {record_id(scope, key),
            compute_fingerprint("POST", "/payments", {}, body, BodyMode::bytes), "payments"};
  }

  IdempotencyFilter::Forward upstream(std::uint16_t status, std::string body = "{\"id\":1}") {
    return [this, status, body]() -> asio::awaitable<UpstreamReply> {
      ++executions;
      UpstreamReply reply;
      reply.kind = UpstreamReply::Kind::response;
      reply.response.status = status;
      reply.response.headers = {
          {"Content-Type", "application/json"}, {"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"}};
      reply.response.body = body;
      co_return reply;
    };
  }

  /// An upstream that answers 201 after `delay` (a timer on the test's io_context).
  IdempotencyFilter::Forward slow_upstream(std::chrono::milliseconds delay) {
    return [this, delay]() -> asio::awaitable<UpstreamReply> {
      ++executions;
      asio::steady_timer timer(co_await asio::this_coro::executor, delay);
      co_await timer.async_wait(asio::use_awaitable);
      UpstreamReply reply;
      reply.kind = UpstreamReply::Kind::response;
      reply.response.status = 201;
      reply.response.body = "slow";
      co_return reply;
    };
  }

  IdempotencyFilter::Forward failing(UpstreamReply::Kind kind) {
    return [this, kind]() -> asio::awaitable<UpstreamReply> {
      ++executions;
      UpstreamReply reply;
      reply.kind = kind;
      reply.detail = "upstream failed";
      co_return reply;
    };
  }

  /// Starts `f` on `req` without running `io`; the result lands in `out` once `io` runs.
  void spawn(IdempotencyFilter& f, KeyedRequest req, IdempotencyFilter::Forward forward,
             std::optional<FilterResult>& out) {
    asio::co_spawn(io, f.run(policy, std::move(req), std::move(forward)),
                   [&out](std::exception_ptr e, FilterResult r) {
                     if (e) std::rethrow_exception(e);
                     out = std::move(r);
                   });
  }

  /// Runs the filter to its end and returns its result. FilterResult's outcome defaults to
  /// `executed`, so the result is only taken from a coroutine that completed: one that never
  /// finished (it waits on something that never comes) fails the test here instead of passing
  /// as an execution.
  FilterResult run(KeyedRequest req, IdempotencyFilter::Forward forward) {
    return run(filter, std::move(req), std::move(forward));
  }

  /// The same through `f`, a filter with other dependencies (a commit budget).
  FilterResult run(IdempotencyFilter& f, KeyedRequest req, IdempotencyFilter::Forward forward) {
    std::optional<FilterResult> out;
    spawn(f, std::move(req), std::move(forward), out);
    io.restart();
    io.run();
    BOOST_REQUIRE_MESSAGE(out.has_value(), "the filter's coroutine did not complete");
    return std::move(*out);
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(idempotency_filter, Fixture)

BOOST_AUTO_TEST_CASE(spec_C15_first_request_executes_once_and_commits_before_reply) {
  const auto req = request("k1");
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(executions == 1);
  BOOST_TEST(r.response.status == 201);
  BOOST_REQUIRE(store.get(req.id) != nullptr);
  BOOST_TEST(store.get(req.id)->response.status == 201);
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));  // replaced by the committed marker (C23)
}

BOOST_AUTO_TEST_CASE(spec_C16_retry_replays_stored_response_without_upstream_call) {
  const auto req = request("k1");
  run(req, upstream(201, "first"));
  const FilterResult r = run(req, upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(executions == 1);
  BOOST_TEST(r.response.body == "first");
  BOOST_TEST(r.response.headers.size() == 3u);
  BOOST_TEST(r.response.headers[2].second == "b=2");
  // A replay is one lock store round trip: the marker answers it, Postgres is not asked.
  BOOST_TEST(lock.acquire_calls == 2);
  BOOST_TEST(store.find_calls == 1);
}

BOOST_AUTO_TEST_CASE(spec_C17_same_key_different_request_is_a_mismatch_and_record_kept) {
  run(request("k1", "{\"amount\":1}"), upstream(201, "first"));
  const FilterResult r = run(request("k1", "{\"amount\":2}"), upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::mismatch));
  BOOST_TEST(executions == 1);
  const FilterResult again = run(request("k1", "{\"amount\":1}"), upstream(201));
  BOOST_TEST(static_cast<int>(again.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(again.response.body == "first");
}

BOOST_AUTO_TEST_CASE(spec_C18_in_flight_duplicate_is_rejected_without_upstream_call) {
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "someone-else", 30s));
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(executions == 0);
  BOOST_TEST(contention == 1);
  BOOST_TEST(lock.owner(req.id) == "someone-else");
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_replays_when_the_first_commits) {
  policy.wait_for_in_flight = true;
  policy.wait_timeout = 10s;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 30s));
  // The first request commits after the waiter has polled a few times.
  int finds_before_commit = 4;
  store.before_find = [&] {
    if (--finds_before_commit == 0) {
      StoredRecord rec;
      rec.id = req.id;
      rec.fingerprint = req.fingerprint;
      rec.response.status = 201;
      rec.response.body = "first";
      store.put(rec, 1h);
    }
  };
  const FilterResult r = run(req, upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(r.response.body == "first");
  BOOST_TEST(executions == 0);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_competes_for_the_lock_when_the_first_ends_unstored) {
  policy.wait_for_in_flight = true;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 30s));
  lock.before_acquire = [&] {
    if (lock.acquire_calls == 3) lock.drop(req.id);  // the first ended unstored and released
  };
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_gives_409_when_wait_timeout_runs_out) {
  policy.wait_for_in_flight = true;
  policy.wait_timeout = 30ms;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 1h));
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(executions == 0);
  BOOST_TEST(lock.acquire_calls >= 2);
}

BOOST_AUTO_TEST_CASE(record_committed_between_lookup_and_acquire_is_replayed_not_reexecuted) {
  // Check-then-act race: the first request commits and releases right after our lookup.
  const auto req = request("k1");
  lock.before_acquire = [&] {
    StoredRecord rec;
    rec.id = req.id;
    rec.fingerprint = req.fingerprint;
    rec.response.status = 201;
    rec.response.body = "first";
    store.put(rec, 1h);
  };
  const FilterResult r = run(req, upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(r.response.body == "first");
  BOOST_TEST(executions == 0);
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));  // the record found is cached again
}

BOOST_AUTO_TEST_CASE(spec_C21_status_outside_store_statuses_stores_nothing_and_frees_key) {
  const auto req = request("k1");
  for (std::uint16_t status : {500, 503, 429, 401, 403, 408}) {
    const FilterResult r = run(req, upstream(status));
    BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::not_stored));
    BOOST_TEST(r.response.status == status);
  }
  BOOST_TEST(executions == 6);
  BOOST_TEST(store.size() == 0u);
  BOOST_TEST(lock.owner(req.id).empty());
}

BOOST_AUTO_TEST_CASE(spec_C21_upstream_not_reached_releases_the_lock) {
  const auto req = request("k1");
  const FilterResult r = run(req, failing(UpstreamReply::Kind::not_reached));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::upstream_error));
  BOOST_TEST(static_cast<int>(r.upstream_kind) ==
             static_cast<int>(UpstreamReply::Kind::not_reached));
  BOOST_TEST(lock.owner(req.id).empty());
  BOOST_TEST(store.size() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C22_unknown_outcome_holds_the_lock_by_default) {
  const auto req = request("k1");
  const FilterResult r = run(req, failing(UpstreamReply::Kind::timed_out));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::upstream_error));
  BOOST_TEST(!lock.owner(req.id).empty());
  const FilterResult retry = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C22_unknown_outcome_release_frees_the_lock_at_once) {
  policy.hold_on_unknown_outcome = false;
  const auto req = request("k1");
  run(req, failing(UpstreamReply::Kind::unknown_outcome));
  BOOST_TEST(lock.owner(req.id).empty());
  const FilterResult retry = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::executed));
}

BOOST_AUTO_TEST_CASE(spec_C23_lock_is_renewed_by_its_owner_while_the_upstream_runs) {
  policy.lock_ttl = 30ms;
  const auto req = request("k1");
  std::string owner_during_call;
  IdempotencyFilter::Forward slow = [&]() -> asio::awaitable<UpstreamReply> {
    ++executions;
    // Wait until the filter has renewed three times (event-driven, not a fixed sleep).
    asio::steady_timer t(co_await asio::this_coro::executor);
    while (lock.renew_calls < 3) {
      t.expires_after(1ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    owner_during_call = lock.owner(req.id);
    UpstreamReply reply;
    reply.kind = UpstreamReply::Kind::response;
    reply.response.status = 201;
    co_return reply;
  };
  lock.now = [] { return MemoryLock::Clock::time_point{}; };  // no expiry: only renewals count
  const FilterResult r = run(req, slow);
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(lock.renew_calls >= 3);
  BOOST_TEST(!owner_during_call.empty());
  BOOST_TEST(owner_during_call != "someone-else");
}

BOOST_AUTO_TEST_CASE(spec_C23_release_is_owner_only) {
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "holder", 1h));
  // A second gateway whose lock expired must not free the current holder's lock.
  run(req, upstream(201));
  BOOST_TEST(lock.owner(req.id) == "holder");
}

BOOST_AUTO_TEST_CASE(spec_C24_expired_records_are_treated_as_absent) {
  const auto req = request("k1");
  auto t = std::chrono::system_clock::now();
  auto lock_t = MemoryLock::Clock::now();
  store.now = [&t] { return t; };
  lock.now = [&lock_t] { return lock_t; };
  policy.ttl = 1h;
  run(req, upstream(201, "first"));
  t += 2h;
  lock_t += 2h;  // the marker (≤ ttl) is gone too
  const FilterResult r = run(req, upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.response.body == "second");
  BOOST_TEST(executions == 2);
}

BOOST_AUTO_TEST_CASE(spec_C25_store_error_fails_closed_without_calling_upstream) {
  store.fail_find_at = 1;
  const FilterResult r = run(request("k1"), upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::store_unavailable));
  BOOST_TEST(executions == 0);
  lock.fail_acquire_at = lock.acquire_calls + 1;
  const FilterResult r2 = run(request("k2"), upstream(201));
  BOOST_TEST(static_cast<int>(r2.outcome) == static_cast<int>(Outcome::store_unavailable));
  BOOST_TEST(executions == 0);
}

BOOST_AUTO_TEST_CASE(spec_C25_store_error_fail_open_forwards_unprotected) {
  policy.fail_open = true;
  lock.fail_acquire_at = 1;
  const FilterResult r = run(request("k1"), upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::unprotected));
  BOOST_TEST(r.response.status == 201);
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C26_commit_failure_returns_the_response_and_keeps_the_lock) {
  policy.commit_timeout = 0ms;  // one attempt
  store.fail_insert_at = 1;
  const auto req = request("k1");
  const FilterResult r = run(req, upstream(201, "paid"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.record_commit_failed);
  BOOST_TEST(r.response.body == "paid");
  BOOST_TEST(commit_failures == 1);
  BOOST_TEST(!lock.owner(req.id).empty());
  const FilterResult retry = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C26_a_failed_commit_is_retried_with_the_lock_renewed_until_it_commits) {
  // A failover: the first three inserts fail, the fourth reaches the new primary. The client's
  // answer waits for it; the lock (lock_ttl far shorter than the retries) is renewed meanwhile.
  policy.commit_timeout = 10s;
  policy.lock_ttl = 60ms;
  store.fail_insert_at = 1;
  store.fail_inserts = 3;
  // No expiry: a renewal that a loaded machine runs late must not lose the lock; renew_calls
  // says the renewals ran.
  lock.now = [] { return MemoryLock::Clock::time_point{}; };
  const auto req = request("k1");
  const auto started = std::chrono::steady_clock::now();
  const FilterResult r = run(req, upstream(201, "paid"));
  const auto took = std::chrono::steady_clock::now() - started;
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(!r.record_commit_failed);
  BOOST_TEST(r.response.body == "paid");
  BOOST_TEST(store.insert_calls == 4);
  BOOST_REQUIRE(store.get(req.id) != nullptr);
  BOOST_TEST(store.get(req.id)->response.body == "paid");
  BOOST_TEST(commit_failures == 0);
  BOOST_TEST(store_errors ==
             (std::vector<std::string>{"record commit", "record commit", "record commit"}));
  // Backoff 50, 100, 200 ms, each jittered down to half at most.
  BOOST_TEST(took >= 175ms);
  BOOST_TEST(lock.renew_calls >= 2);
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));  // the lock became the marker
  const FilterResult retry = run(req, upstream(201, "again"));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(retry.response.body == "paid");
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C26_a_retried_commit_that_finds_its_own_row_is_not_a_duplicate) {
  // The first insert commits but its answer is lost (Postgres killed right after COMMIT): the
  // retry finds this request's own row, which is no second execution (C36 stays at 0).
  store.fail_insert_at = 1;
  store.failed_inserts_commit = true;
  const auto req = request("k1");
  const FilterResult r = run(req, upstream(201, "paid"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(!r.duplicate_execution);
  BOOST_TEST(!r.record_commit_failed);
  BOOST_TEST(r.response.body == "paid");
  BOOST_TEST(duplicates == 0);
  BOOST_TEST(store.insert_calls == 2);
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));

  // Another execution's row is still a duplicate, retried commit or not.
  const auto other = request("k2");
  store.fail_insert_at = store.insert_calls + 1;
  store.before_insert = [&] {
    if (store.insert_calls == store.fail_insert_at + 1) {
      StoredRecord rec;
      rec.id = other.id;
      rec.fingerprint = other.fingerprint;
      rec.response.status = 201;
      rec.response.body = "first";
      store.put(rec, 1h);
    }
  };
  store.failed_inserts_commit = false;
  const FilterResult d = run(other, upstream(201, "second"));
  BOOST_TEST(d.duplicate_execution);
  BOOST_TEST(d.response.body == "first");
  BOOST_TEST(duplicates == 1);
}

BOOST_AUTO_TEST_CASE(spec_C26_a_commit_failing_past_commit_timeout_answers_unrecorded) {
  policy.commit_timeout = 300ms;
  store.fail_insert_at = 1;
  store.fail_inserts = 1000;
  const auto req = request("k1");
  const auto started = std::chrono::steady_clock::now();
  const FilterResult r = run(req, upstream(201, "paid"));
  const auto took = std::chrono::steady_clock::now() - started;
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.record_commit_failed);
  BOOST_TEST(r.response.body == "paid");
  BOOST_TEST(store.insert_calls >= 3);
  BOOST_TEST(took >= 300ms);
  BOOST_TEST(commit_failures == 1);
  BOOST_TEST(!lock.owner(req.id).empty());  // kept until lock_ttl: quick retries get 409
  const FilterResult retry = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(a_lock_renewal_that_throws_is_reported_and_stopped_not_rethrown) {
  // Before, the renewal task's completion rethrew into the io thread: the process ended.
  policy.lock_ttl = 30ms;  // renewed every 10 ms while the upstream takes 100 ms
  lock.before_renew = [] { throw std::runtime_error("renewal exploded"); };
  const auto req = request("k1");
  const FilterResult r = run(req, slow_upstream(100ms));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.response.body == "slow");
  BOOST_TEST(lock.renew_calls == 1);  // the renewal stopped at its first exception
  BOOST_TEST(task_failures == (std::vector<std::string>{"lock renew: renewal exploded"}));
  BOOST_REQUIRE(store.get(req.id) != nullptr);
}

BOOST_AUTO_TEST_CASE(spec_C29_large_body_is_stored_without_body_and_never_reexecuted) {
  policy.max_stored_response = 8;
  const auto req = request("k1");
  const FilterResult first = run(req, upstream(200, "0123456789"));
  BOOST_TEST(first.response.body == "0123456789");
  const FilterResult r = run(req, upstream(200));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(r.response.body_omitted);
  BOOST_TEST(r.response.body.empty());
  BOOST_TEST(r.response.status == 200);
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C39_a_response_passed_on_unheld_is_stored_without_body) {
  // The forwarder did not hold the body (it is past max_stored_response and still on its way to
  // the client): the record keeps status and fields, and the replays, the marker's included,
  // say the body was omitted.
  const auto req = request("k1");
  const auto passed_on = [this]() -> asio::awaitable<UpstreamReply> {
    ++executions;
    UpstreamReply reply;
    reply.kind = UpstreamReply::Kind::response;
    reply.response.status = 200;
    reply.response.headers = {{"Content-Type", "application/octet-stream"}};
    reply.response.body_omitted = true;
    co_return reply;
  };
  const FilterResult first = run(req, passed_on);
  BOOST_TEST(static_cast<int>(first.outcome) == static_cast<int>(Outcome::executed));
  const StoredRecord* stored = store.get(req.id);
  BOOST_REQUIRE(stored != nullptr);
  BOOST_TEST(stored->response.body_omitted);
  BOOST_TEST(stored->response.status == 200);
  const auto marker = decode_replay_marker(lock.owner(req.id));
  BOOST_REQUIRE(marker.has_value());
  BOOST_REQUIRE(marker->response.has_value());
  BOOST_TEST(marker->response->body_omitted);
  const FilterResult replay = run(req, upstream(200));
  BOOST_TEST(static_cast<int>(replay.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(replay.response.body_omitted);
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C36_existing_record_wins_over_a_duplicate_execution) {
  const auto req = request("k1");
  store.before_insert = [&] {
    // The lock was lost (e.g. Redis failover) and another gateway committed first.
    StoredRecord rec;
    rec.id = req.id;
    rec.fingerprint = req.fingerprint;
    rec.response.status = 201;
    rec.response.body = "winner";
    store.put(rec, 1h);
  };
  const FilterResult r = run(req, upstream(201, "loser"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(r.duplicate_execution);
  BOOST_TEST(r.response.body == "winner");
  BOOST_TEST(duplicates == 1);
  BOOST_TEST(store.get(req.id)->response.body == "winner");
}

BOOST_AUTO_TEST_CASE(spec_C20_different_scopes_never_share_records) {
  const Sha256 alice =
      compute_scope("payments", std::vector<HeaderValues>{{"Authorization", {"a"}}});
  const Sha256 bob = compute_scope("payments", std::vector<HeaderValues>{{"Authorization", {"b"}}});
  KeyedRequest ra = request("k");
  KeyedRequest rb = request("k");
  ra.id = record_id(alice, "k");
  rb.id = record_id(bob, "k");
  run(ra, upstream(201, "alice"));
  const FilterResult r = run(rb, upstream(201, "bob"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.response.body == "bob");
  BOOST_TEST(executions == 2);
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_mode_over_max_waiters_gets_409_at_once) {
  policy.wait_for_in_flight = true;
  policy.wait_timeout = 2s;
  policy.max_waiters = 2;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 1h));

  // Two waiters, then one over the bound. When the third has its answer, the two are still
  // waiting; the first request then commits and both replay.
  std::vector<std::optional<FilterResult>> results(3);
  std::size_t waiting_when_third_ended = 0;
  bool waiter_done_before_third = false;
  for (std::size_t i = 0; i < results.size(); ++i) {
    asio::co_spawn(io, filter.run(policy, req, upstream(201)),
                   [&, i](std::exception_ptr e, FilterResult r) {
                     if (e) std::rethrow_exception(e);
                     results[i] = std::move(r);
                     if (i < 2 && !results[2]) waiter_done_before_third = true;
                     if (i != 2) return;
                     waiting_when_third_ended = filter.waiters(req.id);
                     StoredRecord rec;
                     rec.id = req.id;
                     rec.fingerprint = req.fingerprint;
                     rec.response.status = 201;
                     rec.response.body = "first";
                     store.put(rec, 1h);
                   });
  }
  io.run();

  BOOST_REQUIRE(results[2].has_value());
  BOOST_TEST(static_cast<int>(results[2]->outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(!waiter_done_before_third);
  BOOST_TEST(waiting_when_third_ended == 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_REQUIRE(results[i].has_value());
    BOOST_TEST(static_cast<int>(results[i]->outcome) == static_cast<int>(Outcome::replayed), i);
    BOOST_TEST(results[i]->response.body == "first");
  }
  BOOST_TEST(executions == 0);
  BOOST_TEST(filter.waiters(req.id) == 0u);  // every slot was given back
}

BOOST_AUTO_TEST_CASE(spec_C18_max_waiters_zero_makes_wait_mode_answer_like_reject) {
  policy.wait_for_in_flight = true;
  policy.wait_timeout = 2s;
  policy.max_waiters = 0;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 1h));
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(lock.acquire_calls == 1);  // no polling
  BOOST_TEST(executions == 0);
}

BOOST_AUTO_TEST_CASE(spec_C18_a_waiter_that_takes_the_lock_no_longer_counts_as_waiting) {
  policy.wait_for_in_flight = true;
  policy.max_waiters = 1;
  const auto req = request("k1");
  BOOST_REQUIRE(lock.take(req.id, "first", 30s));
  lock.before_acquire = [&] {
    if (lock.acquire_calls == 3) lock.drop(req.id);  // the first ended unstored and released
  };
  std::size_t waiting_while_executing = 99;
  const FilterResult r = run(req, [&]() -> asio::awaitable<UpstreamReply> {
    waiting_while_executing = filter.waiters(req.id);
    const IdempotencyFilter::Forward forward = upstream(201);
    co_return co_await forward();
  });
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(waiting_while_executing == 0u);
  BOOST_TEST(filter.waiters(req.id) == 0u);
}

// --- The committed marker (C23): the lock becomes a marker after the commit ---------------

BOOST_AUTO_TEST_CASE(spec_C23_the_lock_becomes_a_committed_marker_after_the_commit) {
  const auto req = request("k1");
  run(req, upstream(201, "first"));
  const std::string value = lock.owner(req.id);
  BOOST_REQUIRE(is_replay_marker(value));
  const auto marker = decode_replay_marker(value);
  BOOST_REQUIRE(marker.has_value());
  BOOST_TEST(marker->fingerprint == req.fingerprint);
  BOOST_REQUIRE(marker->response.has_value());
  BOOST_TEST(marker->response->body == "first");
  BOOST_TEST(lock.replace_calls == 1);
  BOOST_TEST(lock.release_calls == 0);
}

BOOST_AUTO_TEST_CASE(spec_C16_a_replay_from_the_marker_equals_the_record_and_skips_postgres) {
  const auto req = request("k1");
  run(req, upstream(201, "first"));
  const int finds = store.find_calls;
  const FilterResult from_marker = run(req, upstream(201, "second"));
  BOOST_TEST(store.find_calls == finds);  // no Postgres lookup
  BOOST_TEST(from_marker.from_marker);
  lock.drop(req.id);  // Redis lost the marker: the record answers
  const FilterResult from_record = run(req, upstream(201, "third"));
  BOOST_TEST(!from_record.from_marker);
  BOOST_TEST(store.find_calls == finds + 1);
  for (const FilterResult* r : {&from_marker, &from_record}) {
    BOOST_TEST(static_cast<int>(r->outcome) == static_cast<int>(Outcome::replayed));
    BOOST_TEST(r->response.status == 201);
    BOOST_TEST(r->response.body == "first");
    BOOST_TEST((r->response.headers == store.get(req.id)->response.headers));
  }
  BOOST_TEST(executions == 1);
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));  // put back by the record lookup
}

BOOST_AUTO_TEST_CASE(spec_C17_a_mismatch_against_the_marker_is_decided_without_postgres) {
  run(request("k1", "{\"amount\":1}"), upstream(201, "first"));
  const int finds = store.find_calls;
  const FilterResult r = run(request("k1", "{\"amount\":2}"), upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::mismatch));
  BOOST_TEST(r.from_marker);
  BOOST_TEST(store.find_calls == finds);
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C25_a_failed_marker_write_releases_the_lock) {
  // The committed marker cannot be written (Redis times the replace out): the lock must not
  // stay behind until lock_ttl, or every retry meets it instead of putting the marker back.
  lock.fail_replace = true;
  const auto req = request("k1");
  const FilterResult first = run(req, upstream(201, "paid"));
  BOOST_TEST(static_cast<int>(first.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(lock.replace_calls == 1);
  BOOST_TEST(lock.owner(req.id).empty());
  BOOST_TEST((store_errors == std::vector<std::string>{"lock replace"}));
  lock.fail_replace = false;
  const FilterResult retry = run(req, upstream(201, "again"));
  BOOST_TEST(static_cast<int>(retry.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(retry.response.body == "paid");
  BOOST_TEST(is_replay_marker(lock.owner(req.id)));  // the retry put the marker back
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C23_a_response_over_replay_cache_max_bytes_replays_through_postgres) {
  policy.replay_cache_max_bytes = 16;
  const auto req = request("k1");
  run(req, upstream(201, std::string(64, 'x')));
  const auto marker = decode_replay_marker(lock.owner(req.id));
  BOOST_REQUIRE(marker.has_value());
  BOOST_TEST(!marker->response.has_value());  // fingerprint only
  const int finds = store.find_calls;
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(!r.from_marker);
  BOOST_TEST(store.find_calls == finds + 1);
  BOOST_TEST(r.response.body == std::string(64, 'x'));
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(spec_C26_no_marker_is_written_when_the_commit_fails) {
  policy.commit_timeout = 0ms;
  store.fail_insert_at = 1;
  const auto req = request("k1");
  const FilterResult r = run(req, upstream(201));
  BOOST_TEST(r.record_commit_failed);
  BOOST_TEST(lock.replace_calls == 0);
  const std::string value = lock.owner(req.id);
  BOOST_TEST(!value.empty());
  BOOST_TEST(!is_replay_marker(value));  // the plain lock, kept until lock_ttl
}

BOOST_AUTO_TEST_CASE(spec_C23_a_marker_whose_record_is_gone_is_dropped_and_the_key_executes) {
  policy.replay_cache_max_bytes = 0;  // markers without the response: the record is looked up
  const auto req = request("k1");
  run(req, upstream(201, "first"));
  BOOST_REQUIRE(is_replay_marker(lock.owner(req.id)));
  store.erase(req.id);  // purged behind the marker's back
  const FilterResult r = run(req, upstream(201, "again"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(r.response.body == "again");
  BOOST_TEST(executions == 2);
}

BOOST_AUTO_TEST_CASE(spec_C23_replay_cache_ttl_zero_deletes_the_lock_instead) {
  policy.replay_cache_ttl = 0ms;
  const auto req = request("k1");
  run(req, upstream(201));
  BOOST_TEST(lock.owner(req.id).empty());
  BOOST_TEST(lock.replace_calls == 0);
  BOOST_TEST(lock.release_calls == 1);
}

BOOST_AUTO_TEST_CASE(spec_C24_a_marker_never_outlives_its_record) {
  policy.ttl = 1h;
  const auto req = request("k1");
  // A record with ten seconds left, found under the lock: its marker ends before them.
  StoredRecord rec;
  rec.id = req.id;
  rec.fingerprint = req.fingerprint;
  rec.response.status = 201;
  store.put(rec, 10s);
  auto fake_now = MemoryLock::Clock::now();
  lock.now = [&] { return fake_now; };
  run(req, upstream(201));
  BOOST_REQUIRE(is_replay_marker(lock.owner(req.id)));
  fake_now += 10s;
  BOOST_TEST(lock.owner(req.id).empty());
  BOOST_TEST(executions == 0);
}

BOOST_AUTO_TEST_CASE(spec_C25_a_lock_store_failure_still_replays_a_committed_record) {
  const auto req = request("k1");
  run(req, upstream(201, "first"));
  lock.fail_acquire_at = lock.acquire_calls + 1;
  const FilterResult r = run(req, upstream(201, "second"));
  BOOST_TEST(static_cast<int>(r.outcome) == static_cast<int>(Outcome::replayed));
  BOOST_TEST(r.response.body == "first");
  BOOST_TEST(executions == 1);
}

BOOST_AUTO_TEST_CASE(replay_markers_round_trip_and_reject_garbage) {
  ReplayMarker marker;
  marker.fingerprint[0] = 7;
  marker.response = StoredResponse{204, {{"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"}}, "", false};
  const std::string value = encode_replay_marker(marker);
  BOOST_TEST(is_replay_marker(value));
  BOOST_TEST(!is_replay_marker(random_token()));
  const auto back = decode_replay_marker(value);
  BOOST_REQUIRE(back.has_value());
  BOOST_TEST(back->fingerprint == marker.fingerprint);
  BOOST_TEST(back->response->status == 204);
  BOOST_TEST((back->response->headers == marker.response->headers));
  for (std::size_t cut = 0; cut < value.size(); ++cut) {
    BOOST_TEST(!decode_replay_marker(std::string_view(value).substr(0, cut)).has_value());
  }
  BOOST_TEST(!decode_replay_marker(value + "x").has_value());
  std::string omitted_without_response = encode_replay_marker(ReplayMarker{marker.fingerprint, {}});
  omitted_without_response.back() = '\x02';  // body_omitted with no response: not canonical
  BOOST_TEST(!decode_replay_marker(omitted_without_response).has_value());
  ReplayMarker odd = marker;
  odd.response->status = 1000;  // no HTTP status: refused like a stored record's
  BOOST_TEST(!decode_replay_marker(encode_replay_marker(odd)).has_value());
  std::string huge_count = value;
  huge_count[4 + 32 + 1 + 2] = '\x7f';  // header count's top byte
  BOOST_TEST(!decode_replay_marker(huge_count).has_value());
}

// ---- the commit queue's bound (SPEC C54) ----------------------------------------------------

BOOST_AUTO_TEST_CASE(spec_C54_a_full_commit_queue_sheds_before_any_store_is_asked) {
  auto budget = std::make_shared<CommitBudget>(1);
  IdempotencyFilter bounded(store, lock, {}, budget);
  const CommitBudget::Place taken = budget->try_take();  // another request's place
  BOOST_REQUIRE(static_cast<bool>(taken));
  const FilterResult out = run(bounded, request("k1"), upstream(201));
  BOOST_TEST(static_cast<int>(out.outcome) == static_cast<int>(Outcome::shed));
  BOOST_TEST(std::string(outcome_label(out.outcome)) == "shed");
  BOOST_TEST(executions == 0);
  BOOST_TEST(lock.acquire_calls == 0);  // no lock
  BOOST_TEST(store.find_calls == 0);    // no record looked up or written
  BOOST_TEST(store.insert_calls == 0);
  BOOST_TEST(budget->pending() == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C54_an_executing_request_keeps_its_place_until_its_record_commits) {
  auto budget = std::make_shared<CommitBudget>(1);
  IdempotencyFilter bounded(store, lock, {}, budget);
  std::optional<std::size_t> pending_at_commit;
  store.before_insert = [&] { pending_at_commit = budget->pending(); };
  const FilterResult out = run(bounded, request("k1"), upstream(201));
  BOOST_TEST(static_cast<int>(out.outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(pending_at_commit.value_or(0) == 1u);
  BOOST_TEST(budget->pending() == 0u);  // given back once the record is committed
}

BOOST_AUTO_TEST_CASE(spec_C54_a_waiter_holds_no_place_while_it_waits) {
  policy.wait_for_in_flight = true;
  policy.wait_timeout = 200ms;
  auto budget = std::make_shared<CommitBudget>(1);
  IdempotencyFilter bounded(store, lock, {}, budget);
  const auto held = request("held");
  BOOST_REQUIRE(lock.take(held.id, "first", 1h));
  std::optional<FilterResult> waiter;
  std::optional<FilterResult> other;
  spawn(bounded, held, upstream(201), waiter);
  // Starts while the first one polls: with a budget of one place, it executes only if the
  // waiter gave its place back.
  asio::steady_timer later(io, 50ms);
  later.async_wait(
      [&](boost::system::error_code) { spawn(bounded, request("other"), upstream(201), other); });
  io.run();
  BOOST_REQUIRE(waiter.has_value());
  BOOST_REQUIRE(other.has_value());
  BOOST_TEST(static_cast<int>(other->outcome) == static_cast<int>(Outcome::executed));
  BOOST_TEST(static_cast<int>(waiter->outcome) == static_cast<int>(Outcome::in_flight));
  BOOST_TEST(budget->pending() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
