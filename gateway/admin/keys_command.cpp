#include "gateway/admin/keys_command.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <exception>
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
using PgPtr = std::unique_ptr<PGconn, PgDeleter>;
using ResultPtr = std::unique_ptr<PGresult, PgResultDeleter>;

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

/// Runs `body` to its end on `io`, the CLI's own event loop (the product's Redis client runs on
/// it as on an io thread), and returns its value.
template <class T>
T run_on(boost::asio::io_context& io, boost::asio::awaitable<T> body) {
  std::optional<T> out;
  std::exception_ptr failure;
  boost::asio::co_spawn(io, std::move(body), [&](std::exception_ptr e, T value) {
    if (e) {
      failure = e;
    } else {
      out = std::move(value);
    }
    io.stop();  // an open Redis connection keeps a read armed: run() would not return
  });
  io.restart();
  io.run();
  if (failure) std::rethrow_exception(failure);
  return std::move(*out);
}

/// The lock key's server through the gateway's own Redis client: the single server, the
/// primary the sentinels name (SPEC C41) or the cluster node owning the key's slot, following
/// MOVED and ASK (SPEC C42).
class LockKeyStore {
 public:
  explicit LockKeyStore(const config::Redis& options)
      : client_(
            storage::redis::make_redis_client(io_.get_executor(), cli_options(options), nullptr)) {}

  /// The reply to `command` on `key`'s server; nullopt (with the reason on `err`) when the
  /// store failed or answered an error.
  std::optional<storage::redis::Reply> run(const std::string& key, storage::redis::Command command,
                                           std::ostream& err) {
    const std::string name = command.front();
    auto reply = run_on(io_, client_->execute(key, std::move(command)));
    if (reply && !reply->is_error()) return std::move(*reply);
    err << "idemgate keys: Redis " << name << " failed: ";
    if (reply) {
      err << reply->str << "\n";
      return std::nullopt;
    }
    // The probe says what is wrong in the operator's terms (which sentinel, which node).
    const std::string why = run_on(io_, client_->probe());
    err << (why.empty() ? reply.error().message() : why) << "\n";
    return std::nullopt;
  }

 private:
  static config::Redis cli_options(config::Redis options) {
    // An operator's one-off command, not the request path: a slow store gets a moment more.
    options.operation_timeout =
        std::max(options.operation_timeout, config::Duration(std::chrono::seconds(2)));
    return options;
  }

  boost::asio::io_context io_;  // before the client, which must go first
  std::unique_ptr<storage::redis::RedisClient> client_;
};

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
  LockKeyStore redis(config.storage.redis);
  // The lock key holds an owner token while a request is in flight, and the committed marker
  // (C23) once its record is committed.
  const auto got = redis.run(lock_key, {"GET", lock_key}, err);
  if (!got) return kKeysNotFound;
  const std::string value = got->kind == storage::redis::Reply::Kind::string ? got->str : "";

  if (request.action == KeysRequest::Action::show) {
    const ResultPtr rows = exec_with_id(pg.get(), kShow, id);
    if (PQresultStatus(rows.get()) != PGRES_TUPLES_OK) {
      err << "idemgate keys: " << PQerrorMessage(pg.get());
      return kKeysNotFound;
    }
    const bool marker = core::is_replay_marker(value);
    const bool held = !value.empty() && !marker;
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
  const auto del = redis.run(lock_key, {"DEL", lock_key}, err);
  if (!del) return kKeysNotFound;
  const long long locks_deleted = del->integer;
  if (!record_deleted && locks_deleted == 0) {
    out << "not found\n";
    return kKeysNotFound;
  }
  if (record_deleted) out << "deleted record " << core::to_hex(id) << "\n";
  if (locks_deleted > 0) {
    out << (core::is_replay_marker(value) ? "deleted replay marker " : "deleted lock ") << lock_key
        << "\n";
  }
  return kKeysFound;
}

}  // namespace idemgate::admin
