// The in-memory fakes used by the core's unit tests run the same contract suites as Postgres and
// Redis, so a fake cannot drift from the behaviour the real stores show.
#define BOOST_TEST_MODULE memory_fakes_contract
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tests/fakes/memory_lock.hpp"
#include "tests/fakes/memory_record_store.hpp"
#include "tests/storage/record_store_fixtures.hpp"

namespace idemgate::testing {

/// MemoryRecordStore on a manual clock: expiry is reached by advancing it, not by sleeping.
struct MemoryBackend {
  MemoryBackend() {
    records.now = [this] { return now; };
  }
  core::RecordStore& store() { return records; }
  template <class T>
  T run(boost::asio::awaitable<T> op) {
    return run_to_completion(io, std::move(op));
  }
  boost::asio::awaitable<void> wait_until_expired(core::Sha256 id) {
    if (const auto* record = records.get(id))
      now = record->expires_at + std::chrono::milliseconds(1);
    co_return;
  }

  boost::asio::io_context io;
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
  MemoryRecordStore records;
};

using RecordStoreBackends = std::tuple<MemoryBackend>;

}  // namespace idemgate::testing

#include "tests/storage/lock_service_contract.hpp"
#include "tests/storage/record_store_contract.hpp"

namespace {

/// MemoryLock on a manual clock.
struct MemoryLockFixture {
  MemoryLockFixture() {
    memory_lock.now = [this] { return now; };
  }
  idemgate::core::LockService& lock() { return memory_lock; }
  void run(boost::asio::awaitable<void> body) {
    idemgate::testing::run_to_completion(io, std::move(body));
  }
  boost::asio::awaitable<void> let_time_pass(std::chrono::milliseconds d) {
    now += d;
    co_return;
  }

  boost::asio::io_context io;
  idemgate::testing::MemoryLock::Clock::time_point now =
      idemgate::testing::MemoryLock::Clock::now();
  idemgate::testing::MemoryLock memory_lock;
};

}  // namespace

IDEMGATE_LOCK_SERVICE_CONTRACT(MemoryLockFixture)
