#include "gateway/admin/keys_command.hpp"

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

#include "gateway/common/json_log.hpp"
#include "gateway/core/fingerprint.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/core/replay_marker.hpp"
#include "gateway/request_identity.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/pg/pg_record_store.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_lock.hpp"

namespace idemgate::admin {
namespace {

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

/// An operator's one-off command, not the request path: a slow store gets a moment more.
config::Duration cli_timeout(config::Duration timeout) {
  return std::max(timeout, config::Duration(std::chrono::seconds(2)));
}

/// The gateway's own stores, driven by the CLI's io_context: the record store on a pool of one
/// connection (the gateway's DSN, statement mode and failover, SPEC C43, C44), and the Redis
/// client reaching the lock key's server as the gateway does: the single server, the primary
/// the sentinels name (SPEC C41) or the cluster node owning the key's slot, following MOVED and
/// ASK (SPEC C42). Each call reports a failure on `err` and returns nullopt.
class KeyStores {
 public:
  explicit KeyStores(const config::Storage& storage)
      : pool_(io_.get_executor(), pool_options(storage.postgres)),
        records_(pool_),
        redis_(storage::redis::make_redis_client(io_.get_executor(), redis_options(storage.redis),
                                                 nullptr)) {}

  /// The live record with this id (nullopt inside: none).
  std::optional<std::optional<core::StoredRecord>> find(const core::Sha256& id, std::ostream& err) {
    auto found = run_on(io_, records_.find(id));
    if (found) return std::move(*found);
    postgres_failed("SELECT", found.error(), err);
    return std::nullopt;
  }

  /// Deletes the record with this id, live or expired: whether there was one.
  std::optional<bool> purge(const core::Sha256& id, std::ostream& err) {
    auto purged = run_on(io_, records_.purge(id));
    if (purged) return *purged;
    postgres_failed("DELETE", purged.error(), err);
    return std::nullopt;
  }

  /// The reply to `command` on `key`'s server; nullopt when the store failed or answered an
  /// error.
  std::optional<storage::redis::Reply> redis(const std::string& key,
                                             storage::redis::Command command, std::ostream& err) {
    const std::string name = command.front();
    auto reply = run_on(io_, redis_->execute(key, std::move(command)));
    if (reply && !reply->is_error()) return std::move(*reply);
    err << "idemgate keys: Redis " << name << " failed: ";
    if (reply) {
      err << reply->str << "\n";
      return std::nullopt;
    }
    // The probe says what is wrong in the operator's terms (which sentinel, which node).
    const std::string why = run_on(io_, redis_->probe());
    err << (why.empty() ? reply.error().message() : why) << "\n";
    return std::nullopt;
  }

 private:
  static storage::pg::PgPool::Options pool_options(const config::Postgres& postgres) {
    storage::pg::PgPool::Options options;
    options.dsn = postgres.dsn;
    options.max_connections = 1;
    options.operation_timeout = cli_timeout(postgres.operation_timeout);
    options.prepared_statements = postgres.prepared_statements;
    return options;
  }

  static config::Redis redis_options(config::Redis options) {
    options.operation_timeout = cli_timeout(options.operation_timeout);
    return options;
  }

  // libpq's own words were logged by the connection (JSON lines on stderr).
  static void postgres_failed(const char* what, const boost::system::error_code& error,
                              std::ostream& err) {
    err << "idemgate keys: Postgres " << what << " failed: " << error.message() << "\n";
  }

  boost::asio::io_context io_;  // before the stores, which must go first
  storage::pg::PgPool pool_;
  storage::pg::PgRecordStore records_;
  std::unique_ptr<storage::redis::RedisClient> redis_;
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
  if (config::contract_of(*route).idempotency.mode == config::IdempotencyMode::off) {
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
  const core::KeyParse key = read_key(config::contract_of(*route).idempotency, request.key);
  if (key.status != core::KeyParse::Status::valid) {
    err << "idemgate keys: invalid key: "
        << (key.detail.empty() ? std::string("no key given") : key.detail) << "\n";
    return kKeysBadArguments;
  }
  const core::Sha256 id = core::record_id(request_scope(*route, scope_fields), key.key);
  const std::string lock_key = storage::redis::RedisLock::key_of(id);

  KeyStores stores(config.storage);
  // The lock key holds an owner token while a request is in flight, and the committed marker
  // (C23) once its record is committed.
  const auto got = stores.redis(lock_key, {"GET", lock_key}, err);
  if (!got) return kKeysNotFound;
  const std::string value = got->kind == storage::redis::Reply::Kind::string ? got->str : "";

  if (request.action == KeysRequest::Action::show) {
    const auto found = stores.find(id, err);
    if (!found) return kKeysNotFound;
    const bool marker = core::is_replay_marker(value);
    const bool held = !value.empty() && !marker;
    if (!found->has_value()) {
      out << "not found\n";
      if (held) out << "lock held (a request with this key is in flight)\n";
      if (marker) out << "replay_marker present (it answers for the key until it expires)\n";
      return kKeysNotFound;
    }
    const core::StoredRecord& record = **found;
    out << "id " << core::to_hex(id) << "\n"
        << "route " << record.route << "\n"
        << "status " << record.response.status << "\n"
        << "created " << common::format_rfc3339(record.created_at) << "\n"
        << "expires " << common::format_rfc3339(record.expires_at) << "\n"
        << "fingerprint " << core::to_hex(record.fingerprint) << "\n"
        << "body_size " << record.response.body.size() << "\n"
        << "body_omitted " << (record.response.body_omitted ? "true" : "false") << "\n"
        << "lock " << (held ? "held" : "free") << "\n"
        << "replay_marker " << (marker ? "present" : "absent") << "\n";
    return kKeysFound;
  }

  const auto record_deleted = stores.purge(id, err);
  if (!record_deleted) return kKeysNotFound;
  const auto del = stores.redis(lock_key, {"DEL", lock_key}, err);
  if (!del) return kKeysNotFound;
  const long long locks_deleted = del->integer;
  if (!*record_deleted && locks_deleted == 0) {
    out << "not found\n";
    return kKeysNotFound;
  }
  if (*record_deleted) out << "deleted record " << core::to_hex(id) << "\n";
  if (locks_deleted > 0) {
    out << (core::is_replay_marker(value) ? "deleted replay marker " : "deleted lock ") << lock_key
        << "\n";
  }
  return kKeysFound;
}

}  // namespace idemgate::admin
