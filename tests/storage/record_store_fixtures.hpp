#pragma once
// Helpers shared by the RecordStore test suites: running a coroutine (or inserts at once) to
// completion, ids, sample records whose bytes exercise the store, and a field-by-field
// comparison.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gateway/core/hash.hpp"
#include "gateway/core/record_store.hpp"

namespace idemgate::testing {

/// Runs `op` on `io` until it completes and returns its value (rethrows its exception).
template <class T>
T run_to_completion(boost::asio::io_context& io, boost::asio::awaitable<T> op) {
  std::optional<T> value;
  std::exception_ptr failure;
  boost::asio::co_spawn(io, std::move(op), [&](std::exception_ptr e, T v) {
    if (e) {
      failure = e;
    } else {
      value.emplace(std::move(v));
    }
  });
  io.restart();
  io.run();
  if (failure) std::rethrow_exception(failure);
  if (!value) throw std::logic_error("operation did not complete");
  return std::move(*value);
}

inline void run_to_completion(boost::asio::io_context& io, boost::asio::awaitable<void> op) {
  std::exception_ptr failure;
  bool done = false;
  boost::asio::co_spawn(io, std::move(op), [&](std::exception_ptr e) {
    if (e) failure = e;
    done = true;
  });
  io.restart();
  io.run();
  if (failure) std::rethrow_exception(failure);
  if (!done) throw std::logic_error("operation did not complete");
}

/// Starts every one of `ops` at once on `io` (with group commit or batched lookups they share
/// statements) and runs them all to completion; the results in the order of `ops`.
template <class T>
std::vector<T> run_together(boost::asio::io_context& io,
                            std::vector<boost::asio::awaitable<T>> ops) {
  std::vector<std::optional<T>> outcomes(ops.size());
  std::exception_ptr failure;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    boost::asio::co_spawn(io, std::move(ops[i]),
                          [&outcomes, &failure, i](std::exception_ptr e, T r) {
                            if (e) {
                              failure = e;
                            } else {
                              outcomes[i].emplace(std::move(r));
                            }
                          });
  }
  io.restart();
  io.run();
  if (failure) std::rethrow_exception(failure);
  std::vector<T> results;
  for (auto& outcome : outcomes) {
    if (!outcome) throw std::logic_error("operation did not complete");
    results.push_back(std::move(*outcome));
  }
  return results;
}

/// Every insert of `batch` at once (run_together).
inline std::vector<boost::system::result<core::InsertResult>> insert_together(
    boost::asio::io_context& io, core::RecordStore& store,
    const std::vector<core::StoredRecord>& batch, std::chrono::milliseconds ttl) {
  std::vector<boost::asio::awaitable<boost::system::result<core::InsertResult>>> ops;
  for (const auto& record : batch) ops.push_back(store.insert(record, ttl));
  return run_together(io, std::move(ops));
}

/// A lookup of every id of `ids` at once (run_together).
inline std::vector<boost::system::result<std::optional<core::StoredRecord>>> find_together(
    boost::asio::io_context& io, core::RecordStore& store, const std::vector<core::Sha256>& ids) {
  std::vector<boost::asio::awaitable<boost::system::result<std::optional<core::StoredRecord>>>> ops;
  for (const auto& id : ids) ops.push_back(store.find(id));
  return run_together(io, std::move(ops));
}

/// A fresh random record id.
inline core::Sha256 random_id() {
  return core::Sha256Builder().field(core::random_token()).finish();
}

/// A record whose every byte field exercises the store: repeated and ordered header fields,
/// `\0` and non-UTF-8 bytes in a header value and in the body.
inline core::StoredRecord sample_record(std::string tag) {
  core::StoredRecord record;
  record.id = random_id();
  record.route = "payments";
  record.fingerprint = core::Sha256Builder().field("fingerprint").field(tag).finish();
  record.response.status = 201;
  record.response.headers = {
      {"Location", "/payments/" + tag},
      {"Set-Cookie", "a=1; Path=/"},
      {"ETag", "\"v1\""},
      {"Set-Cookie", "b=2; Path=/"},
      {"X-Binary", std::string("nul\0after\xff\xfe\x80", 12)},
  };
  record.response.body = std::string("{\"id\":\"", 7) + tag + std::string("\"}\0\xc3\x28\xff", 6);
  return record;
}

inline void check_same_response(const core::StoredRecord& actual,
                                const core::StoredRecord& expected) {
  BOOST_TEST(actual.id == expected.id);
  BOOST_TEST(actual.route == expected.route);
  BOOST_TEST(actual.fingerprint == expected.fingerprint);
  BOOST_TEST(actual.response.status == expected.response.status);
  BOOST_TEST_REQUIRE(actual.response.headers.size() == expected.response.headers.size());
  for (std::size_t i = 0; i < expected.response.headers.size(); ++i) {
    BOOST_TEST_CONTEXT("header " << i) {
      BOOST_TEST(actual.response.headers[i].first == expected.response.headers[i].first);
      BOOST_TEST(actual.response.headers[i].second == expected.response.headers[i].second);
    }
  }
  BOOST_TEST(actual.response.body == expected.response.body);
  BOOST_TEST(actual.response.body_omitted == expected.response.body_omitted);
}

inline constexpr std::chrono::milliseconds kLongTtl = std::chrono::hours(1);

}  // namespace idemgate::testing
