#pragma once
// In-memory LockService for unit tests of the core, with fault knobs.

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "gateway/core/lock_service.hpp"

namespace idemgate::testing {

/// Keeps locks in a map with expiry from `now` (a manual clock in tests). Knobs: fail the n-th
/// acquire, a hook before each acquire, counters of calls.
class MemoryLock final : public core::LockService {
 public:
  using Clock = std::chrono::steady_clock;

  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  int fail_acquire_at = 0;  ///< 1-based call number of try_acquire() to fail; 0: never
  boost::system::error_code failure = core::store_errc::unavailable;
  std::function<void()> before_acquire;
  std::function<void()> before_renew;  ///< may throw, as a failing lock implementation would
  int acquire_calls = 0;
  int renew_calls = 0;
  int release_calls = 0;
  int replace_calls = 0;
  bool fail_replace = false;  ///< replace() answers `failure`

  boost::asio::awaitable<boost::system::result<core::Acquired>> acquire(
      core::Sha256 id, std::string token, std::chrono::milliseconds ttl) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++acquire_calls;
    if (before_acquire) before_acquire();
    if (acquire_calls == fail_acquire_at)
      co_return boost::system::result<core::Acquired>(boost::system::in_place_error, failure);
    std::string held = owner(id);
    if (!held.empty()) co_return core::Acquired{false, std::move(held)};
    take(id, std::move(token), ttl);
    co_return core::Acquired{true, {}};
  }

  boost::asio::awaitable<boost::system::result<bool>> renew(
      core::Sha256 id, std::string token, std::chrono::milliseconds ttl) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++renew_calls;
    if (before_renew) before_renew();
    auto it = locks_.find(id);
    if (it == locks_.end() || it->second.expires <= now() || it->second.token != token) {
      co_return false;
    }
    it->second.expires = now() + ttl;
    co_return true;
  }

  boost::asio::awaitable<boost::system::result<bool>> release(core::Sha256 id,
                                                              std::string token) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++release_calls;
    auto it = locks_.find(id);
    if (it == locks_.end() || it->second.token != token) co_return false;
    locks_.erase(it);
    co_return true;
  }

  boost::asio::awaitable<boost::system::result<bool>> replace(
      core::Sha256 id, std::string token, std::string value,
      std::chrono::milliseconds ttl) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++replace_calls;
    if (fail_replace) {
      co_return boost::system::result<bool>(boost::system::in_place_error, failure);
    }
    auto it = locks_.find(id);
    if (it == locks_.end() || it->second.expires <= now() || it->second.token != token) {
      co_return false;
    }
    it->second = {std::move(value), now() + ttl};
    co_return true;
  }

  /// Synchronous acquire with the same semantics, for arranging state in tests.
  bool take(const core::Sha256& id, std::string token, std::chrono::milliseconds ttl) {
    auto it = locks_.find(id);
    if (it != locks_.end() && it->second.expires > now()) return false;
    locks_[id] = {std::move(token), now() + ttl};
    return true;
  }

  /// Removes a lock whoever holds it (its owner released it, or it expired).
  void drop(const core::Sha256& id) { locks_.erase(id); }

  /// The value of a live key (an owner token or a committed marker), or empty.
  std::string owner(const core::Sha256& id) const {
    auto it = locks_.find(id);
    return it == locks_.end() || it->second.expires <= now() ? std::string() : it->second.token;
  }

 private:
  struct Entry {
    std::string token;
    Clock::time_point expires;
  };
  std::map<core::Sha256, Entry> locks_;
};

}  // namespace idemgate::testing
