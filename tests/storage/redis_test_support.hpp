#pragma once
// Shared pieces of the Redis integration tests: the store address from the environment and an
// io_context runner. Tests fail (not skip) when IDEMGATE_REDIS_ADDR is missing.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gateway/common/use_nothrow.hpp"
#include "gateway/config/config.hpp"
#include "storage/redis/redis_connection.hpp"
#include "tests/support/polling.hpp"

namespace idemgate::test {

using idemgate::common::use_nothrow;

/// hiredis writes with write(2): a write to a connection the server closed raises SIGPIPE.
struct IgnoreSigpipe {
  IgnoreSigpipe() { std::signal(SIGPIPE, SIG_IGN); }
};

/// `storage.redis` pointing at IDEMGATE_REDIS_ADDR (`host:port`); throws when it is missing.
inline config::Redis redis_options_from_env() {
  const char* addr = std::getenv("IDEMGATE_REDIS_ADDR");
  if (addr == nullptr || *addr == '\0') {
    throw std::runtime_error(
        "IDEMGATE_REDIS_ADDR is not set (eval \"$(scripts/local-stores start)\")");
  }
  const std::string text = addr;
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("IDEMGATE_REDIS_ADDR is not host:port");
  config::Redis options;
  options.address = text.substr(0, colon);
  options.port = static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1)));
  options.operation_timeout = std::chrono::seconds(10);
  return options;
}

/// Runs every `body` concurrently on `io` until all have ended, then stops `io` (an open Redis
/// connection always has a read pending, so `run()` would not return by itself); rethrows the
/// first exception (a failed BOOST_REQUIRE included).
inline void run_all(boost::asio::io_context& io, std::vector<boost::asio::awaitable<void>> bodies) {
  std::exception_ptr failure;
  std::size_t finished = 0;
  const std::size_t started = bodies.size();
  for (auto& body : bodies) {
    boost::asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
      if (e && !failure) failure = e;
      if (++finished == started) io.stop();
    });
  }
  if (started == 0) return;
  io.restart();
  io.run();
  if (failure) std::rethrow_exception(failure);
  BOOST_REQUIRE_EQUAL(finished, started);
}

inline void run_one(boost::asio::io_context& io, boost::asio::awaitable<void> body) {
  std::vector<boost::asio::awaitable<void>> bodies;
  bodies.push_back(std::move(body));
  run_all(io, std::move(bodies));
}

/// Awaits a command and returns its reply; a store error fails the case.
inline boost::asio::awaitable<storage::redis::Reply> reply_of(
    boost::asio::awaitable<boost::system::result<storage::redis::Reply>> op) {
  auto r = co_await std::move(op);
  BOOST_REQUIRE_MESSAGE(r.has_value(), "redis command failed: " << r.error().message());
  co_return std::move(*r);
}

/// Waits for `d` on a real timer.
inline boost::asio::awaitable<void> sleep_for(boost::asio::any_io_executor executor,
                                              std::chrono::milliseconds d) {
  boost::asio::steady_timer timer(executor, d);
  co_await timer.async_wait(use_nothrow);
}

/// Polls `condition` on `executor` every few milliseconds until it holds (true) or the safety
/// deadline kEventDeadline passes (false): for state a test cannot await as an event. The
/// coroutine form of tests/support/polling.hpp's eventually(), for a test on an io_context.
inline boost::asio::awaitable<bool> eventually(boost::asio::any_io_executor executor,
                                               std::function<bool()> condition) {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) co_return false;
    co_await sleep_for(executor, std::chrono::milliseconds(5));
  }
  co_return true;
}

}  // namespace idemgate::test
