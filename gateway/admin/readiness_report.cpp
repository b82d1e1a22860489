#include "gateway/admin/readiness_report.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json/array.hpp>
#include <chrono>
#include <future>
#include <ostream>

#include "storage/pg/pg_checks.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/redis/redis_checks.hpp"
#include "storage/redis/redis_client.hpp"

namespace idemgate::admin {

namespace asio = boost::asio;
namespace json = boost::json;

bool ReadinessReport::stores_answer() const {
  return std::all_of(stores.begin(), stores.end(), [](const Store& s) { return s.error.empty(); });
}

bool ReadinessReport::any_check_failed() const {
  return std::any_of(checks.begin(), checks.end(), [](const core::StoreCheck& c) {
    return c.verdict == core::StoreCheck::Verdict::failed;
  });
}

std::string ReadinessReport::status() const {
  if (draining) return "draining";
  if (!stores_answer()) return "unavailable";
  return degraded ? "degraded" : "ready";
}

json::object ReadinessReport::to_json() const {
  json::object body;
  body["status"] = status();
  if (draining) return body;
  json::array failing;
  json::array store_list;
  for (const auto& s : stores) {
    if (!s.error.empty()) failing.emplace_back(s.name);
    body[s.name] = s.error.empty() ? std::string("ok") : s.error;
    store_list.push_back(json::object{
        {"name", s.name}, {"state", s.error.empty() ? "ok" : "failed"}, {"detail", s.error}});
  }
  if (!failing.empty()) body["failing"] = std::move(failing);
  body["stores"] = std::move(store_list);
  json::array check_list;
  for (const auto& c : checks) {
    check_list.push_back(json::object{{"name", c.name},
                                      {"verdict", std::string(core::verdict_text(c.verdict))},
                                      {"detail", c.detail}});
  }
  body["checks"] = std::move(check_list);
  if (degraded) {
    body["degraded"] =
        "a fail_open route forwarded a request without deduplication in the last 10 s";
  }
  return body;
}

std::string ReadinessReport::to_text() const {
  std::string out;
  for (const auto& s : stores) {
    out += s.name + ": " + (s.error.empty() ? "ok" : "failed: " + s.error) + "\n";
  }
  for (const auto& c : checks) {
    out += c.name + ": " + std::string(core::verdict_text(c.verdict)) + ": " + c.detail + "\n";
  }
  return out;
}

StoreChecker::StoreChecker(asio::any_io_executor executor, const config::Storage& storage,
                           std::shared_ptr<core::PrimaryTracker> pg_primary,
                           std::shared_ptr<core::PrimaryTracker> redis_primary)
    : allow_eviction_(storage.redis.allow_eviction) {
  storage::pg::PgPool::Options pg_options;
  pg_options.dsn = storage.postgres.dsn;
  pg_options.max_connections = 1;
  pg_options.operation_timeout = storage.postgres.operation_timeout;
  pg_options.prepared_statements = storage.postgres.prepared_statements;
  pg_options.tracker = std::move(pg_primary);
  pg_ = std::make_unique<storage::pg::PgPool>(executor, pg_options);
  redis_ = storage::redis::make_redis_client(executor, storage.redis, std::move(redis_primary));
}

// The Redis client goes first: its connections are registered with the io_context (the rule of
// RedisConnection), as are the pool's.
StoreChecker::~StoreChecker() {
  redis_.reset();
  pg_.reset();
}

namespace {

asio::awaitable<std::string> probe_postgres(storage::pg::PgPool* pg) {
  auto rows = co_await pg->query("SELECT 1", {});
  if (!rows) co_return rows.error().message();
  if (rows->rows() != 1) co_return "unexpected answer to SELECT 1";
  co_return "";
}

asio::awaitable<std::string> probe_redis(storage::redis::RedisClient* redis) {
  co_return co_await redis->probe();
}

asio::awaitable<std::vector<core::StoreCheck>> all_checks(storage::pg::PgPool* pg,
                                                          storage::redis::RedisClient* redis,
                                                          bool allow_eviction) {
  using namespace asio::experimental::awaitable_operators;
  auto [eviction, sync, schema] = co_await (
      storage::redis::check_eviction_policy(*redis, allow_eviction) &&
      storage::pg::check_synchronous_commit(*pg) && storage::pg::check_schema_version(*pg));
  co_return std::vector<core::StoreCheck>{std::move(eviction), std::move(sync), std::move(schema)};
}

}  // namespace

asio::awaitable<ReadinessReport> StoreChecker::run(bool with_checks) {
  using namespace asio::experimental::awaitable_operators;
  ReadinessReport report;
  auto [pg_error, redis_error] = co_await (probe_postgres(pg_.get()) && probe_redis(redis_.get()));
  report.stores = {{"postgres", std::move(pg_error)}, {"redis", std::move(redis_error)}};
  if (with_checks) report.checks = co_await all_checks(pg_.get(), redis_.get(), allow_eviction_);
  co_return report;
}

int check_stores(const config::Config& config, std::ostream& out) {
  asio::io_context io{1};
  ReadinessReport report;
  {
    StoreChecker checker(io.get_executor(), config.storage);
    auto done = asio::co_spawn(io, checker.run(true), asio::use_future);
    // Not io.run(): the store connections keep a read armed, so it would never run out of work.
    while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) io.run_one();
    report = done.get();
  }
  out << report.to_text();
  return report.stores_answer() && !report.any_check_failed() ? 0 : 1;
}

}  // namespace idemgate::admin
