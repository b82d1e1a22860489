#include "storage/redis/redis_lock.hpp"

#include <openssl/evp.h>

#include <boost/asio/error.hpp>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gateway/common/hex.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using core::store_errc;

constexpr char kKeyPrefix[] = "idemgate:lock:";

constexpr char kRenewScript[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  return redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "end\n"
    "return 0\n";

constexpr char kReleaseScript[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  return redis.call('DEL', KEYS[1])\n"
    "end\n"
    "return 0\n";

constexpr char kReplaceScript[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
    "  return 1\n"
    "end\n"
    "return 0\n";

// Redis < 7.0 refuses SET with both NX and GET: the same get-or-set as a script.
constexpr char kAcquireScript[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v then return v end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return false\n";

std::string sha1_hex(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha1(), nullptr) != 1) {
    throw std::runtime_error("EVP_Digest(SHA-1) failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string millis(std::chrono::milliseconds ttl) {
  // PX and PEXPIRE refuse 0 and negative values; a lock shorter than 1 ms is a caller bug.
  return std::to_string(std::max<std::chrono::milliseconds::rep>(ttl.count(), 1));
}

// result<bool> cannot be built from an error_code implicitly (error_code converts to bool).
boost::system::result<bool> failure(boost::system::error_code ec) {
  return {boost::system::in_place_error, ec};
}

bool is_noscript(const Reply& r) {
  return r.is_error() && r.str.starts_with("NOSCRIPT");
}

}  // namespace

RedisLock::RedisLock(RedisClient& client, Options options)
    : client_(client),
      options_(options),
      renew_{kRenewScript, sha1_hex(kRenewScript)},
      release_{kReleaseScript, sha1_hex(kReleaseScript)},
      replace_{kReplaceScript, sha1_hex(kReplaceScript)},
      acquire_{kAcquireScript, sha1_hex(kAcquireScript)} {}

std::string RedisLock::key_of(const core::Sha256& id) {
  // Written in place: one allocation per key.
  constexpr std::size_t prefix = sizeof(kKeyPrefix) - 1;
  std::string key(prefix + 2 * id.size(), '\0');
  key.replace(0, prefix, kKeyPrefix);
  common::hex_into(id.data(), id.size(), key.data() + prefix);
  return key;
}

asio::awaitable<boost::system::result<core::Acquired>> RedisLock::acquire(
    core::Sha256 id, std::string token, std::chrono::milliseconds ttl) {
  using Result = boost::system::result<core::Acquired>;
  std::string key = key_of(id);
  if (options_.wait_replicas > 0) co_return co_await acquire_and_wait(std::move(key), token, ttl);
  for (;;) {
    // The command and its undo are built in a statement without a suspension: their
    // temporaries stay out of this frame (GCC 12 keeps those of an awaited expression there),
    // so it stays under Asio's 1020-byte recycling limit.
    const bool nx_get = set_nx_get_;
    auto call =
        nx_get
            ? client_.execute(
                  key, std::vector<std::string>{"SET", key, token, "NX", "PX", millis(ttl), "GET"},
                  undo_of(key, token))
            : eval(&acquire_, key, std::vector<std::string>{token, millis(ttl)},
                   undo_of(key, token));
    auto reply = co_await std::move(call);
    if (nx_get && reply && reply->is_error() && reply->str.find("syntax") != std::string::npos) {
      set_nx_get_ = false;  // Redis < 7.0: NX and GET together are a syntax error there
      continue;
    }
    if (!reply) co_return Result(boost::system::in_place_error, reply.error());
    // nil: the key was free and is ours now; a string: what holds it (not set, NX).
    if (reply->is_nil()) co_return core::Acquired{true, {}};
    if (reply->kind == Reply::Kind::string) co_return core::Acquired{false, std::move(reply->str)};
    co_return Result(boost::system::in_place_error, store_errc::protocol);
  }
}

asio::awaitable<boost::system::result<core::Acquired>> RedisLock::acquire_and_wait(
    std::string key, std::string token, std::chrono::milliseconds ttl) {
  using Result = boost::system::result<core::Acquired>;
  // WAIT's own timeout ends well before the pair's deadline, so a slow replica is an answer
  // ("fewer acknowledgements"), not a torn-down connection.
  const auto timeout =
      std::max<std::chrono::milliseconds::rep>(1, options_.wait_timeout.count() * 3 / 4);
  RedisClient& client = options_.acquire_client != nullptr ? *options_.acquire_client : client_;
  for (int attempt = 0; attempt < 2; ++attempt) {
    // WAIT counts the replication offset of its own connection: it goes right behind the write.
    std::vector<std::string> argv =
        set_nx_get_
            ? std::vector<std::string>{"SET", key, token, "NX", "PX", millis(ttl), "GET"}
            : std::vector<std::string>{"EVAL", acquire_.source, "1", key, token, millis(ttl)};
    std::vector<std::string> wait{"WAIT", std::to_string(options_.wait_replicas),
                                  std::to_string(timeout)};
    std::vector<Command> pair{std::move(argv), std::move(wait)};
    auto replies = co_await client.execute(key, std::move(pair), undo_of(key, token));
    if (!replies) co_return Result(boost::system::in_place_error, replies.error());
    const Reply& taken = (*replies)[0];
    if (set_nx_get_ && taken.is_error() && taken.str.find("syntax") != std::string::npos) {
      set_nx_get_ = false;  // Redis < 7.0: NX and GET together are a syntax error there
      continue;
    }
    if (taken.kind == Reply::Kind::string) co_return core::Acquired{false, taken.str};
    if (!taken.is_nil()) break;
    const Reply& acks = (*replies)[1];
    if (acks.kind == Reply::Kind::integer && acks.integer >= options_.wait_replicas) {
      co_return core::Acquired{true, {}};
    }
    // Too few replicas hold the lock: a failover now could lose it, so it does not count as
    // taken.
    std::vector<std::string> args{token};
    (void)co_await run(&release_, key, std::move(args), undo_of(key, token));
    co_return Result(boost::system::in_place_error, store_errc::unavailable);
  }
  co_return Result(boost::system::in_place_error, store_errc::protocol);
}

asio::awaitable<boost::system::result<bool>> RedisLock::renew(core::Sha256 id, std::string token,
                                                              std::chrono::milliseconds ttl) {
  std::vector<std::string> args{std::move(token), millis(ttl)};
  co_return co_await run(&renew_, key_of(id), std::move(args), Undo{});
}

asio::awaitable<boost::system::result<bool>> RedisLock::release(core::Sha256 id,
                                                                std::string token) {
  std::string key = key_of(id);
  Undo undo = undo_of(key, token);
  std::vector<std::string> args{std::move(token)};
  co_return co_await run(&release_, std::move(key), std::move(args), std::move(undo));
}

asio::awaitable<boost::system::result<bool>> RedisLock::replace(core::Sha256 id, std::string token,
                                                                std::string value,
                                                                std::chrono::milliseconds ttl) {
  std::string key = key_of(id);
  // Lost, the replace may or may not have run: the undo deletes the lock if it still holds the
  // token, and leaves a marker that did get written.
  Undo undo = undo_of(key, token);
  std::vector<std::string> args{std::move(token), std::move(value), millis(ttl)};
  co_return co_await run(&replace_, std::move(key), std::move(args), std::move(undo));
}

Undo RedisLock::undo_of(const std::string& key, const std::string& token) {
  return Undo{kReleaseScript, key, token};
}

asio::awaitable<boost::system::result<Reply>> RedisLock::eval(const Script* script, std::string key,
                                                              std::vector<std::string> args,
                                                              Undo undo) {
  std::vector<std::string> argv{"EVALSHA", script->sha1, "1", std::move(key)};
  argv.insert(argv.end(), std::make_move_iterator(args.begin()),
              std::make_move_iterator(args.end()));
  auto reply = co_await client_.execute(argv[3], argv, undo);
  if (reply && is_noscript(*reply)) {
    // The script cache is empty (Redis restarted, a failover to a replica that never saw the
    // script, SCRIPT FLUSH): EVAL loads it again and runs it.
    argv[0] = "EVAL";
    argv[1] = script->source;
    std::string routed = argv[3];
    reply = co_await client_.execute(std::move(routed), std::move(argv), std::move(undo));
  }
  co_return reply;
}

asio::awaitable<boost::system::result<bool>> RedisLock::run(const Script* script, std::string key,
                                                            std::vector<std::string> args,
                                                            Undo undo) {
  auto reply = co_await eval(script, std::move(key), std::move(args), std::move(undo));
  if (!reply) co_return failure(reply.error());
  if (reply->kind != Reply::Kind::integer) co_return failure(store_errc::protocol);
  co_return reply->integer == 1;
}

}  // namespace idemgate::storage::redis
