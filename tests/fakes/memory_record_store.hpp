#pragma once
// In-memory RecordStore for unit tests of the core, with fault knobs (STYLE: self-checking fakes).

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>

#include "gateway/core/record_store.hpp"

namespace idemgate::testing {

/// Keeps records in a map. Time comes from `now` (a manual clock in tests). Knobs: make the n-th
/// find or insert fail, and a hook that runs before each operation (to interleave another actor).
class MemoryRecordStore final : public core::RecordStore {
 public:
  using Clock = std::chrono::system_clock;

  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  int fail_find_at = 0;                ///< 1-based call number of find() to fail; 0: never
  int fail_insert_at = 0;              ///< 1-based call number of insert() to fail; 0: never
  int fail_inserts = 1;                ///< how many insert() calls fail from fail_insert_at on
  bool failed_inserts_commit = false;  ///< a failing insert() stores its record all the same
  boost::system::error_code failure = core::store_errc::unavailable;
  std::function<void()> before_find;
  std::function<void()> before_insert;
  int find_calls = 0;
  int insert_calls = 0;

  boost::asio::awaitable<boost::system::result<std::optional<core::StoredRecord>>> find(
      core::Sha256 id) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++find_calls;
    if (before_find) before_find();
    if (find_calls == fail_find_at) co_return failure;
    auto it = records_.find(id);
    if (it == records_.end() || it->second.expires_at <= now()) {
      co_return std::optional<core::StoredRecord>{};
    }
    co_return std::optional<core::StoredRecord>{it->second};
  }

  boost::asio::awaitable<boost::system::result<core::InsertResult>> insert(
      core::StoredRecord record, std::chrono::milliseconds ttl) override {
    co_await boost::asio::post(co_await boost::asio::this_coro::executor,
                               boost::asio::use_awaitable);
    ++insert_calls;
    if (before_insert) before_insert();
    if (fail_insert_at > 0 && insert_calls >= fail_insert_at &&
        insert_calls < fail_insert_at + fail_inserts) {
      if (failed_inserts_commit) put(std::move(record), ttl);  // the answer was lost, not the row
      co_return failure;
    }
    co_return put(std::move(record), ttl);
  }

  /// Synchronous insert with the same semantics, for arranging state in tests.
  core::InsertResult put(core::StoredRecord record, std::chrono::milliseconds ttl) {
    auto it = records_.find(record.id);
    if (it != records_.end() && it->second.expires_at > now()) {
      return {false, it->second};
    }
    record.created_at = now();
    record.expires_at = record.created_at + ttl;
    records_[record.id] = std::move(record);
    return {true, std::nullopt};
  }

  std::size_t size() const { return records_.size(); }
  /// Deletes a record whatever its state (a purge behind the gateway's back).
  void erase(const core::Sha256& id) { records_.erase(id); }
  const core::StoredRecord* get(const core::Sha256& id) const {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : &it->second;
  }

 private:
  std::map<core::Sha256, core::StoredRecord> records_;
};

}  // namespace idemgate::testing
