#include "storage/redis/redis_checks.hpp"

#include <string>
#include <vector>

namespace idemgate::storage::redis {

namespace asio = boost::asio;
using core::StoreCheck;

namespace {

// RESP2 answers `CONFIG GET name` with [name, value]; RESP3 servers could use a map, which
// hiredis 0.14 does not speak, so the array is all there is.
std::string policy_of(const Reply& reply) {
  if (reply.kind == Reply::Kind::array && reply.elements.size() == 2) return reply.elements[1].str;
  return {};
}

int rank(StoreCheck::Verdict v) {
  return v == StoreCheck::Verdict::failed ? 2 : v == StoreCheck::Verdict::warning ? 1 : 0;
}

// The verdict over every primary's answer: the worst one, with each primary's detail.
StoreCheck judge(const std::vector<RedisClient::NodeReply>& replies, bool allow_eviction) {
  StoreCheck check{"redis maxmemory-policy", StoreCheck::Verdict::ok, ""};
  std::vector<std::string> details;
  for (const auto& [node, reply] : replies) {
    StoreCheck one{check.name, StoreCheck::Verdict::ok, ""};
    const std::string where = replies.size() > 1 ? node + ": " : std::string();
    if (!reply) {
      one = {check.name, StoreCheck::Verdict::warning,
             where + "could not run: " + reply.error().message()};
    } else if (reply->is_error() || policy_of(*reply).empty()) {
      one = {check.name, StoreCheck::Verdict::warning,
             where + "could not run: CONFIG GET maxmemory-policy was refused (" +
                 (reply->is_error() ? reply->str : std::string("no value")) +
                 "); make sure Redis does not evict the gateway's lock keys"};
    } else {
      const std::string policy = policy_of(*reply);
      if (policy.rfind("allkeys-", 0) == 0) {
        one = {check.name,
               allow_eviction ? StoreCheck::Verdict::warning : StoreCheck::Verdict::failed,
               where + "maxmemory-policy is " + policy +
                   ": Redis may evict an in-flight lock and let a retry execute a second time; "
                   "set maxmemory-policy noeviction" +
                   (allow_eviction ? " (accepted: storage.redis.allow_eviction is true)"
                                   : ", or accept the risk with storage.redis.allow_eviction: "
                                     "true")};
      } else if (policy.rfind("volatile-", 0) == 0) {
        one = {check.name, StoreCheck::Verdict::warning,
               where + "maxmemory-policy is " + policy +
                   ": Redis may evict keys with a TTL, and every lock has one; prefer "
                   "noeviction"};
      } else {
        one.detail = where + "maxmemory-policy is " + policy;
      }
    }
    if (rank(one.verdict) > rank(check.verdict)) check.verdict = one.verdict;
    details.push_back(std::move(one.detail));
  }
  for (const auto& d : details) {
    if (!check.detail.empty()) check.detail += "; ";
    check.detail += d;
  }
  return check;
}

}  // namespace

asio::awaitable<StoreCheck> check_eviction_policy(RedisClient& client, bool allow_eviction) {
  std::vector<std::string> argv{"CONFIG", "GET", "maxmemory-policy"};
  auto replies = co_await client.on_each_primary(std::move(argv));
  co_return judge(replies, allow_eviction);
}

}  // namespace idemgate::storage::redis
