#pragma once
// The behaviour every core::LockService shows (SPEC C23), written once and run against each
// backend (Redis now, in-memory fakes later) so they cannot drift apart.
//
// A backend's test file defines a fixture and expands the suite:
//
//   struct MyLockFixture {
//     core::LockService& lock();
//     // Runs `body` on the fixture's io_context until it ends; rethrows what it threw.
//     void run(boost::asio::awaitable<void> body);
//     // Lets `d` of the lock's clock pass (a real timer, or a fake clock's advance).
//     boost::asio::awaitable<void> let_time_pass(std::chrono::milliseconds d);
//   };
//   IDEMGATE_LOCK_SERVICE_CONTRACT(MyLockFixture)
//
// Every case uses fresh random ids, so the suite may share a store with other tests.

#include <boost/asio/awaitable.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <random>
#include <source_location>
#include <string>

#include "gateway/core/hash.hpp"
#include "gateway/core/lock_service.hpp"

namespace idemgate::test::lock_service_contract {

using namespace std::chrono_literals;

/// A long ttl: no case waits for it to end.
inline constexpr std::chrono::milliseconds kLongTtl = 30s;
/// A short ttl for the cases that let it run out.
inline constexpr std::chrono::milliseconds kShortTtl = 100ms;

inline core::Sha256 random_id() {
  static std::random_device device;
  static std::mt19937_64 engine(device());
  core::Sha256 id;
  for (auto& b : id) b = static_cast<std::uint8_t>(engine());
  return id;
}

/// The value of `r`, failing the case (with the error's message) when it holds an error.
inline bool value_of(const boost::system::result<bool>& r) {
  BOOST_REQUIRE_MESSAGE(r.has_value(), "lock operation failed: " << r.error().message());
  return *r;
}

/// Awaits `op` and checks its answer; `step` names it in a failure. (The co_await stays out of
/// the Boost.Test macros: GCC 12 mishandles some temporaries around co_await in them.)
inline boost::asio::awaitable<void> expect(
    boost::asio::awaitable<boost::system::result<bool>> op, bool expected, std::string step,
    std::source_location where = std::source_location::current()) {
  const auto r = co_await std::move(op);
  const bool got = value_of(r);
  BOOST_CHECK_MESSAGE(got == expected, where.file_name()
                                           << ":" << where.line() << ": " << step << ": expected "
                                           << expected << ", got " << got);
}

/// As `expect`, but a wrong answer ends the case (later steps depend on it).
inline boost::asio::awaitable<void> require(
    boost::asio::awaitable<boost::system::result<bool>> op, bool expected, std::string step,
    std::source_location where = std::source_location::current()) {
  const auto r = co_await std::move(op);
  const bool got = value_of(r);
  BOOST_REQUIRE_MESSAGE(got == expected, where.file_name()
                                             << ":" << where.line() << ": " << step << ": expected "
                                             << expected << ", got " << got);
}

template <class Fixture>
boost::asio::awaitable<void> acquires_a_free_lock(Fixture* f) {
  auto& lock = f->lock();
  co_await expect(lock.try_acquire(random_id(), "owner-a", kLongTtl), true, "acquire a free lock");
}

template <class Fixture>
boost::asio::awaitable<void> second_owner_cannot_acquire_a_held_lock(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), false, "b acquires a held lock");
  co_await expect(lock.try_acquire(id, "owner-a", kLongTtl), false, "a acquires twice (NX)");
}

template <class Fixture>
boost::asio::awaitable<void> locks_on_different_ids_are_independent(Fixture* f) {
  auto& lock = f->lock();
  co_await expect(lock.try_acquire(random_id(), "owner-a", kLongTtl), true, "a acquires id 1");
  co_await expect(lock.try_acquire(random_id(), "owner-b", kLongTtl), true, "b acquires id 2");
}

template <class Fixture>
boost::asio::awaitable<void> owner_renews_and_the_lock_outlives_its_first_ttl(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kShortTtl), true, "a acquires (short ttl)");
  co_await expect(lock.renew(id, "owner-a", kLongTtl), true, "a renews (long ttl)");
  co_await f->let_time_pass(3 * kShortTtl);
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), false, "b acquires after first ttl");
  co_await expect(lock.release(id, "owner-a"), true, "a releases");
}

template <class Fixture>
boost::asio::awaitable<void> non_owner_cannot_renew(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await expect(lock.renew(id, "owner-b", kLongTtl), false, "b renews a's lock");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), false, "b acquires after its renew");
  co_await expect(lock.release(id, "owner-a"), true, "a releases");
}

template <class Fixture>
boost::asio::awaitable<void> renewing_a_lock_that_expired_reports_it_lost(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kShortTtl), true, "a acquires (short ttl)");
  co_await f->let_time_pass(3 * kShortTtl);
  co_await expect(lock.renew(id, "owner-a", kLongTtl), false, "a renews an expired lock");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), true, "b acquires after failed renew");
}

template <class Fixture>
boost::asio::awaitable<void> non_owner_cannot_release_and_the_lock_stays(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await expect(lock.release(id, "owner-b"), false, "b releases a's lock");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), false, "b acquires after release");
  co_await expect(lock.renew(id, "owner-a", kLongTtl), true, "a still owns it");
}

template <class Fixture>
boost::asio::awaitable<void> owner_release_frees_the_lock_once(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await expect(lock.release(id, "owner-a"), true, "a releases");
  co_await expect(lock.release(id, "owner-a"), false, "a releases again (idempotent)");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), true, "b acquires the freed lock");
  co_await expect(lock.release(id, "owner-a"), false, "former owner a releases b's lock");
  co_await expect(lock.try_acquire(id, "owner-c", kLongTtl), false, "c acquires b's lock");
}

template <class Fixture>
boost::asio::awaitable<void> lock_is_free_again_after_its_ttl(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  co_await require(lock.try_acquire(id, "owner-a", kShortTtl), true, "a acquires (short ttl)");
  co_await expect(lock.try_acquire(id, "owner-b", kShortTtl), false, "b acquires before ttl");
  co_await f->let_time_pass(3 * kShortTtl);
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), true, "b acquires after ttl");
  co_await expect(lock.release(id, "owner-a"), false, "expired owner a releases b's lock");
  co_await expect(lock.renew(id, "owner-a", kLongTtl), false, "expired owner a renews b's lock");
  co_await expect(lock.release(id, "owner-b"), true, "b releases");
}

/// Acquires `id` for `token`, which must fail, and returns the value that holds the key.
inline boost::asio::awaitable<std::string> holder_of(core::LockService& lock, core::Sha256 id,
                                                     std::string token) {
  const auto r = co_await lock.acquire(id, std::move(token), kLongTtl);
  BOOST_REQUIRE_MESSAGE(r.has_value(), "acquire failed: " << r.error().message());
  BOOST_CHECK(!r->acquired);
  co_return r->holder;
}

template <class Fixture>
boost::asio::awaitable<void> acquire_returns_what_holds_the_key(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  const auto first = co_await lock.acquire(id, "owner-a", kLongTtl);
  BOOST_REQUIRE_MESSAGE(first.has_value(), "acquire failed: " << first.error().message());
  BOOST_CHECK(first->acquired);
  BOOST_CHECK(first->holder.empty());
  const std::string holder = co_await holder_of(lock, id, "owner-b");
  BOOST_CHECK_EQUAL(holder, "owner-a");
}

template <class Fixture>
boost::asio::awaitable<void> owner_replaces_its_lock_by_a_value_with_its_own_ttl(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  // Binary-safe: a committed marker holds arbitrary bytes (C23).
  const std::string marker("IGM1\0\xff committed", 16);
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await expect(lock.replace(id, "owner-b", marker, kShortTtl), false, "b replaces a's lock");
  co_await expect(lock.replace(id, "owner-a", marker, kShortTtl), true, "a replaces its lock");
  co_await expect(lock.release(id, "owner-a"), false, "a releases after replacing");
  const std::string held = co_await holder_of(lock, id, "owner-c");
  BOOST_CHECK(held == marker);
  co_await f->let_time_pass(3 * kShortTtl);  // the value lives its own ttl, not the lock's
  co_await expect(lock.try_acquire(id, "owner-c", kLongTtl), true, "c acquires after its ttl");
  co_await expect(lock.replace(id, "owner-a", marker, kLongTtl), false,
                  "a replaces c's lock after its own expired");
}

template <class Fixture>
boost::asio::awaitable<void> a_value_is_deleted_only_by_its_exact_bytes(Fixture* f) {
  auto& lock = f->lock();
  const auto id = random_id();
  const std::string marker("IGM1 stale", 10);
  co_await require(lock.try_acquire(id, "owner-a", kLongTtl), true, "a acquires");
  co_await require(lock.replace(id, "owner-a", marker, kLongTtl), true, "a replaces");
  co_await expect(lock.release(id, "IGM1 other"), false, "another value deletes the marker");
  co_await expect(lock.release(id, marker), true, "the marker's bytes delete it");
  co_await expect(lock.try_acquire(id, "owner-b", kLongTtl), true, "b acquires the freed key");
}

}  // namespace idemgate::test::lock_service_contract

#define IDEMGATE_LOCK_CONTRACT_CASE(Fixture, name, body)                     \
  BOOST_FIXTURE_TEST_CASE(name, Fixture) {                                   \
    this->run(::idemgate::test::lock_service_contract::body<Fixture>(this)); \
  }

/// Registers the contract cases for `Fixture` in the current test suite.
#define IDEMGATE_LOCK_SERVICE_CONTRACT(Fixture)                                                   \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_acquires_a_free_lock, acquires_a_free_lock)       \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_second_owner_cannot_acquire_a_held_lock,          \
                              second_owner_cannot_acquire_a_held_lock)                            \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_locks_on_different_ids_are_independent,           \
                              locks_on_different_ids_are_independent)                             \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_owner_renews_and_the_lock_outlives_its_first_ttl, \
                              owner_renews_and_the_lock_outlives_its_first_ttl)                   \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_non_owner_cannot_renew, non_owner_cannot_renew)   \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_renewing_a_lock_that_expired_reports_it_lost,     \
                              renewing_a_lock_that_expired_reports_it_lost)                       \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_non_owner_cannot_release_and_the_lock_stays,      \
                              non_owner_cannot_release_and_the_lock_stays)                        \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_owner_release_frees_the_lock_once,                \
                              owner_release_frees_the_lock_once)                                  \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_lock_is_free_again_after_its_ttl,                 \
                              lock_is_free_again_after_its_ttl)                                   \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_acquire_returns_what_holds_the_key,               \
                              acquire_returns_what_holds_the_key)                                 \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_owner_replaces_its_lock_by_the_committed_marker,  \
                              owner_replaces_its_lock_by_a_value_with_its_own_ttl)                \
  IDEMGATE_LOCK_CONTRACT_CASE(Fixture, spec_C23_a_marker_is_deleted_only_by_its_exact_bytes,      \
                              a_value_is_deleted_only_by_its_exact_bytes)
