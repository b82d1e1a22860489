#include "gateway/admin/keys_command.hpp"

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include <algorithm>
#include <boost/beast/http/fields.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <charconv>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "gateway/core/fingerprint.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/core/replay_marker.hpp"
#include "gateway/request_identity.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_lock.hpp"

namespace idemgate::admin {
namespace {

struct PgDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct PgResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
struct RedisDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using PgPtr = std::unique_ptr<PGconn, PgDeleter>;
using ResultPtr = std::unique_ptr<PGresult, PgResultDeleter>;
using RedisPtr = std::unique_ptr<redisContext, RedisDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

constexpr const char* kShow =
    "SELECT route, status,"
    " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
    " to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
    " encode(fingerprint, 'hex'), octet_length(body), body_omitted"
    " FROM idempotency_record WHERE id = $1 AND expires_at > now()";
constexpr const char* kPurge = "DELETE FROM idempotency_record WHERE id = $1";

// An RFC 6901 reference token, unescaped (~1 → /, ~0 → ~).
std::string unescape_token(std::string_view token) {
  std::string out;
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      out += token[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

// A body holding `value` at `pointer`, so that the core reads the key exactly as from a request.
std::optional<std::string> body_with_value(std::string_view pointer, const std::string& value) {
  boost::system::error_code ec;
  boost::json::value node = boost::json::parse(value, ec);
  if (ec) return std::nullopt;
  if (pointer.empty() || pointer.front() != '/') return std::nullopt;
  std::vector<std::string> tokens;
  for (std::size_t start = 1;;) {
    const auto slash = pointer.find('/', start);
    tokens.push_back(unescape_token(pointer.substr(start, slash - start)));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
    boost::json::object parent;
    parent[*it] = std::move(node);
    node = std::move(parent);
  }
  return boost::json::serialize(node);
}

// The key as a request would carry it, read by the gateway's own reader (request_key): the
// first key field for a header key, one field per part for a composite key, a JSON body for a
// json_pointer key.
core::KeyParse read_key(const config::Idempotency& idem, const std::vector<std::string>& key) {
  const core::KeySpec& spec = idem.key;
  boost::beast::http::fields fields;
  std::string body;
  switch (spec.kind) {
    case core::KeySpec::Kind::header:
      if (key.size() != 1) return core::KeyParse::invalid("expected one KEY");
      fields.insert(spec.fields.front(), key[0]);
      break;
    case core::KeySpec::Kind::headers:
      if (key.size() != spec.fields.size()) {
        return core::KeyParse::invalid("this route's key is made of " +
                                       std::to_string(spec.fields.size()) +
                                       " header values: give one KEY per header, in order");
      }
      for (std::size_t i = 0; i < key.size(); ++i) fields.insert(spec.fields[i], key[i]);
      break;
    case core::KeySpec::Kind::json_pointer: {
      if (key.size() != 1) return core::KeyParse::invalid("expected one KEY");
      auto with_value = body_with_value(spec.json_pointer, key[0]);
      if (!with_value) {
        return core::KeyParse::invalid(
            "this route reads its key from JSON: give KEY as a JSON string or integer, e.g. "
            "'\"evt_1\"' or 42");
      }
      body = std::move(*with_value);
      break;
    }
  }
  return request_key(idem, fields, body);
}

bool split_field(const std::string& text, std::string& name, std::string& value) {
  const auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  name = text.substr(0, colon);
  const auto start = text.find_first_not_of(" \t", colon + 1);
  value = start == std::string::npos ? "" : text.substr(start);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
  return true;
}

PgPtr connect_pg(const std::string& dsn, std::ostream& err) {
  const char* keys[] = {"dbname", "connect_timeout", nullptr};
  const char* values[] = {dsn.c_str(), "5", nullptr};
  PgPtr conn(PQconnectdbParams(keys, values, 1));
  if (!conn || PQstatus(conn.get()) != CONNECTION_OK) {
    err << "idemgate keys: cannot connect to Postgres: "
        << (conn ? PQerrorMessage(conn.get()) : "out of memory") << "\n";
    return nullptr;
  }
  return conn;
}

ResultPtr exec_with_id(PGconn* conn, const char* sql, const core::Sha256& id) {
  const char* values[] = {reinterpret_cast<const char*>(id.data())};
  const int lengths[] = {static_cast<int>(id.size())};
  const int formats[] = {1};
  return ResultPtr(PQexecParams(conn, sql, 1, nullptr, values, lengths, formats, 0));
}

/// One blocking connection to `host:port`, authenticated (AUTH, SELECT) as `options` says.
RedisPtr open_redis(const std::string& host, std::uint16_t port, const std::string& username,
                    const std::string& password, int db, config::Duration operation_timeout,
                    std::ostream& err) {
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(
      std::max(operation_timeout, config::Duration(std::chrono::seconds(2))));
  timeval tv{static_cast<time_t>(timeout.count() / 1'000'000),
             static_cast<suseconds_t>(timeout.count() % 1'000'000)};
  RedisPtr ctx(redisConnectWithTimeout(host.c_str(), port, tv));
  if (!ctx || ctx->err) {
    err << "idemgate keys: cannot connect to Redis at " << storage::redis::endpoint_text(host, port)
        << ": " << (ctx ? ctx->errstr : "out of memory") << "\n";
    return nullptr;
  }
  redisSetTimeout(ctx.get(), tv);
  auto check = [&](ReplyPtr reply, const char* what) {
    if (!reply || reply->type == REDIS_REPLY_ERROR) {
      err << "idemgate keys: Redis " << what
          << " failed: " << (reply ? std::string(reply->str, reply->len) : std::string(ctx->errstr))
          << "\n";
      return false;
    }
    return true;
  };
  if (!password.empty()) {
    ReplyPtr auth(static_cast<redisReply*>(
        username.empty() ? redisCommand(ctx.get(), "AUTH %b", password.data(), password.size())
                         : redisCommand(ctx.get(), "AUTH %b %b", username.data(), username.size(),
                                        password.data(), password.size())));
    if (!check(std::move(auth), "AUTH")) return nullptr;
  }
  if (db != 0 &&
      !check(ReplyPtr(static_cast<redisReply*>(redisCommand(ctx.get(), "SELECT %d", db))),
             "SELECT")) {
    return nullptr;
  }
  return ctx;
}

/// The primary that holds `key`: the single server; under Sentinel the node the sentinels name,
/// once it says it is the primary (SPEC C41); in a cluster the node owning the key's slot,
/// found by following `MOVED` from a seed node (SPEC C42).
RedisPtr connect_redis(const config::Redis& options, const std::string& key, std::ostream& err) {
  using Mode = config::Redis::Mode;
  if (options.mode == Mode::standalone) {
    return open_redis(options.address, options.port, options.username, options.password, options.db,
                      options.operation_timeout, err);
  }
  if (options.mode == Mode::sentinel) {
    for (const auto& sentinel : options.sentinels) {
      RedisPtr s = open_redis(sentinel.host, sentinel.port, options.sentinel_username,
                              options.sentinel_password, 0, options.operation_timeout, err);
      if (!s) continue;
      ReplyPtr addr(static_cast<redisReply*>(
          redisCommand(s.get(), "SENTINEL get-master-addr-by-name %b", options.master_name.data(),
                       options.master_name.size())));
      const std::string who = storage::redis::endpoint_text(sentinel.host, sentinel.port);
      if (!addr || addr->type != REDIS_REPLY_ARRAY || addr->elements != 2 ||
          addr->element[0]->type != REDIS_REPLY_STRING ||
          addr->element[1]->type != REDIS_REPLY_STRING) {
        err << "idemgate keys: sentinel " << who << " does not name a primary for "
            << options.master_name;
        if (addr && addr->type == REDIS_REPLY_ERROR)
          err << ": " << std::string(addr->str, addr->len);
        err << "\n";
        continue;
      }
      const std::string host(addr->element[0]->str, addr->element[0]->len);
      const std::string_view port_text(addr->element[1]->str, addr->element[1]->len);
      int port = 0;
      const auto [end, ec] =
          std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
      if (ec != std::errc{} || end != port_text.data() + port_text.size() || port <= 0 ||
          port > 65535) {
        err << "idemgate keys: sentinel " << who << " names a bad port '" << port_text << "'\n";
        continue;
      }
      RedisPtr primary = open_redis(host, static_cast<std::uint16_t>(port), options.username,
                                    options.password, options.db, options.operation_timeout, err);
      if (!primary) continue;
      ReplyPtr role(static_cast<redisReply*>(redisCommand(primary.get(), "ROLE")));
      if (role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
          role->element[0]->type == REDIS_REPLY_STRING &&
          std::string_view(role->element[0]->str, role->element[0]->len) == "master") {
        return primary;
      }
      err << "idemgate keys: "
          << storage::redis::endpoint_text(host, static_cast<std::uint16_t>(port))
          << " is not the primary\n";
    }
    err << "idemgate keys: no sentinel named a reachable primary for " << options.master_name
        << "\n";
    return nullptr;
  }
  for (const auto& seed : options.cluster) {
    std::string host = seed.host;
    std::uint16_t port = seed.port;
    for (int redirects = 0; redirects < 5; ++redirects) {
      RedisPtr node = open_redis(host, port, options.username, options.password, 0,
                                 options.operation_timeout, err);
      if (!node) break;
      ReplyPtr probe(
          static_cast<redisReply*>(redisCommand(node.get(), "EXISTS %b", key.data(), key.size())));
      if (!probe) break;
      if (probe->type != REDIS_REPLY_ERROR) return node;
      // "MOVED <slot> <host>:<port>": the slot lives on another primary.
      const std::string text(probe->str, probe->len);
      const auto space = text.rfind(' ');
      const auto colon = text.rfind(':');
      if (text.starts_with("ASK ")) {
        err << "idemgate keys: the key's slot is moving between cluster nodes right now; try "
               "again when the migration is done\n";
        return nullptr;
      }
      if (!text.starts_with("MOVED ") || space == std::string::npos || colon == std::string::npos ||
          colon < space) {
        err << "idemgate keys: Redis cluster node " << storage::redis::endpoint_text(host, port)
            << ": " << text << "\n";
        break;
      }
      int moved_port = 0;
      const auto [end, ec] =
          std::from_chars(text.data() + colon + 1, text.data() + text.size(), moved_port);
      if (ec != std::errc{} || end != text.data() + text.size() || moved_port <= 0 ||
          moved_port > 65535) {
        err << "idemgate keys: Redis cluster node " << storage::redis::endpoint_text(host, port)
            << ": " << text << "\n";
        break;
      }
      std::string moved_host = text.substr(space + 1, colon - space - 1);
      if (moved_host.size() >= 2 && moved_host.front() == '[' && moved_host.back() == ']') {
        moved_host = moved_host.substr(1, moved_host.size() - 2);
      }
      // An empty host: the node that answered (it does not know its own address).
      if (!moved_host.empty()) host = std::move(moved_host);
      port = static_cast<std::uint16_t>(moved_port);
    }
  }
  err << "idemgate keys: no Redis cluster node answered for the key\n";
  return nullptr;
}

// The integer reply of `DEL key`, or nullopt on error.
std::optional<long long> redis_key_command(redisContext* ctx, const char* command,
                                           const std::string& key, std::ostream& err) {
  ReplyPtr reply(
      static_cast<redisReply*>(redisCommand(ctx, "%s %b", command, key.data(), key.size())));
  if (!reply || reply->type != REDIS_REPLY_INTEGER) {
    err << "idemgate keys: Redis " << command << " failed: "
        << (reply ? std::string(reply->str ? reply->str : "", reply->len)
                  : std::string(ctx->errstr))
        << "\n";
    return std::nullopt;
  }
  return reply->integer;
}

// What `GET key` holds: nullopt on error, "" when the key is absent.
std::optional<std::string> redis_get(redisContext* ctx, const std::string& key, std::ostream& err) {
  ReplyPtr reply(static_cast<redisReply*>(redisCommand(ctx, "GET %b", key.data(), key.size())));
  if (reply && reply->type == REDIS_REPLY_NIL) return std::string();
  if (!reply || reply->type != REDIS_REPLY_STRING) {
    err << "idemgate keys: Redis GET failed: "
        << (reply ? std::string(reply->str ? reply->str : "", reply->len)
                  : std::string(ctx->errstr))
        << "\n";
    return std::nullopt;
  }
  return std::string(reply->str, reply->len);
}

}  // namespace

int run_keys(const config::Config& config, const KeysRequest& request, std::ostream& out,
             std::ostream& err) {
  const auto route = std::find_if(config.routes.begin(), config.routes.end(),
                                  [&](const config::Route& r) { return r.name == request.route; });
  if (route == config.routes.end()) {
    err << "idemgate keys: no route named '" << request.route << "' in " << config.source_file
        << "\n";
    return kKeysBadArguments;
  }
  if (route->idempotency.mode == config::IdempotencyMode::off) {
    err << "idemgate keys: route '" << route->name << "' has idempotency.mode: off\n";
    return kKeysBadArguments;
  }
  boost::beast::http::fields scope_fields;
  for (const auto& text : request.scope_headers) {
    std::string name;
    std::string value;
    if (!split_field(text, name, value)) {
      err << "idemgate keys: --scope-header takes 'Name: value', got '" << text << "'\n";
      return kKeysBadArguments;
    }
    scope_fields.insert(name, value);
  }
  const core::KeyParse key = read_key(route->idempotency, request.key);
  if (key.status != core::KeyParse::Status::valid) {
    err << "idemgate keys: invalid key: "
        << (key.detail.empty() ? std::string("no key given") : key.detail) << "\n";
    return kKeysBadArguments;
  }
  const core::Sha256 id = core::record_id(request_scope(*route, scope_fields), key.key);
  const std::string lock_key = storage::redis::RedisLock::key_of(id);

  const PgPtr pg = connect_pg(config.storage.postgres.dsn, err);
  if (!pg) return kKeysNotFound;
  const RedisPtr redis = connect_redis(config.storage.redis, lock_key, err);
  if (!redis) return kKeysNotFound;

  if (request.action == KeysRequest::Action::show) {
    const ResultPtr rows = exec_with_id(pg.get(), kShow, id);
    if (PQresultStatus(rows.get()) != PGRES_TUPLES_OK) {
      err << "idemgate keys: " << PQerrorMessage(pg.get());
      return kKeysNotFound;
    }
    // The lock key holds an owner token while a request is in flight, and the committed
    // marker (C23) once its record is committed.
    const auto value = redis_get(redis.get(), lock_key, err);
    if (!value) return kKeysNotFound;
    const bool marker = core::is_replay_marker(*value);
    const bool held = !value->empty() && !marker;
    if (PQntuples(rows.get()) == 0) {
      out << "not found\n";
      if (held) out << "lock held (a request with this key is in flight)\n";
      if (marker) out << "replay_marker present (it answers for the key until it expires)\n";
      return kKeysNotFound;
    }
    auto col = [&](int c) { return std::string(PQgetvalue(rows.get(), 0, c)); };
    out << "id " << core::to_hex(id) << "\n"
        << "route " << col(0) << "\n"
        << "status " << col(1) << "\n"
        << "created " << col(2) << "\n"
        << "expires " << col(3) << "\n"
        << "fingerprint " << col(4) << "\n"
        << "body_size " << col(5) << "\n"
        << "body_omitted " << (col(6) == "t" ? "true" : "false") << "\n"
        << "lock " << (held ? "held" : "free") << "\n"
        << "replay_marker " << (marker ? "present" : "absent") << "\n";
    return kKeysFound;
  }

  const ResultPtr deleted = exec_with_id(pg.get(), kPurge, id);
  if (PQresultStatus(deleted.get()) != PGRES_COMMAND_OK) {
    err << "idemgate keys: " << PQerrorMessage(pg.get());
    return kKeysNotFound;
  }
  const bool record_deleted = std::string_view(PQcmdTuples(deleted.get())) != "0";
  const auto value = redis_get(redis.get(), lock_key, err);
  if (!value) return kKeysNotFound;
  const auto locks_deleted = redis_key_command(redis.get(), "DEL", lock_key, err);
  if (!locks_deleted) return kKeysNotFound;
  if (!record_deleted && *locks_deleted == 0) {
    out << "not found\n";
    return kKeysNotFound;
  }
  if (record_deleted) out << "deleted record " << core::to_hex(id) << "\n";
  if (*locks_deleted > 0) {
    out << (core::is_replay_marker(*value) ? "deleted replay marker " : "deleted lock ") << lock_key
        << "\n";
  }
  return kKeysFound;
}

}  // namespace idemgate::admin
