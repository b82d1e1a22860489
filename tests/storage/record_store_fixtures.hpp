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

/// Starts every insert of `batch` at once on `io` (with group commit they share statements) and
/// runs them all to completion; the results in the order of `batch`.
inline std::vector<boost::system::result<core::InsertResult>> insert_together(
    boost::asio::io_context& io, core::RecordStore& store,
    const std::vector<core::StoredRecord>& batch, std::chrono::milliseconds ttl) {
  std::vector<std::optional<boost::system::result<core::InsertResult>>> outcomes(batch.size());
  std::exception_ptr failure;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    boost::asio::co_spawn(io, store.insert(batch[i], ttl),
                          [&outcomes, &failure, i](std::exception_ptr e,
                                                   boost::system::result<core::InsertResult> r) {
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
  std::vector<boost::system::result<core::InsertResult>> results;
  for (auto& outcome : outcomes) {
    if (!outcome) throw std::logic_error("insert did not complete");
    results.push_back(std::move(*outcome));
  }
  return results;
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
