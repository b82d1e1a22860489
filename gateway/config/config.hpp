#pragma once
// The gateway's configuration as loaded from YAML (SPEC §2). Plain values, validated by the
// loader: every field here already holds a value that is in range. Shared between threads as
// `std::shared_ptr<const Config>` and swapped whole on reload. The proxy's part (listeners,
// limits, upstreams, routes) is defined in gateway/http/settings.hpp; this adds the stores and
// each route's idempotency contract and CORS.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/common/host_port.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/core/status_set.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::config {

using Duration = http::Duration;
using Listen = http::Listen;
using Limits = http::Limits;
using Upstream = http::Upstream;
using RequestId = http::RequestId;
using Match = http::Match;
using Route = http::Route;

/// One `host:port`: an upstream server, a Redis sentinel or a Redis Cluster seed node.
using Server = common::HostPort;

struct Postgres {
  std::string dsn;
  int pool_size = 8;  ///< connections per gateway process, spread over the io threads
  Duration operation_timeout = std::chrono::seconds(2);
  /// false: unnamed statements only, no session state (SPEC C44: PgBouncer transaction pooling).
  bool prepared_statements = true;
  /// Records a process may have waiting for their commit at once, executed or about to be
  /// (SPEC C54); while that many are pending, new keyed requests get 503 before any lock.
  std::size_t max_pending = 10000;
};

/// `storage.redis` — one of three shapes (SPEC C41, C42): a single server (`address`/`port`),
/// a primary found through sentinels (`sentinels` + `master_name`), or a Redis Cluster
/// (`cluster` seed nodes). The loader accepts exactly one shape.
struct Redis {
  enum class Mode { standalone, sentinel, cluster };

  Mode mode = Mode::standalone;
  std::string address = "127.0.0.1";  ///< standalone only
  std::uint16_t port = 6379;          ///< standalone only
  int db = 0;                         ///< standalone and sentinel (a cluster has only db 0)
  std::string password;               ///< empty: no AUTH
  /// Redis 6 ACL user for `AUTH username password`; empty: `AUTH password` (the default user).
  std::string username;
  /// Sentinel mode: the sentinels asked in turn for the primary of `master_name`.
  std::vector<Server> sentinels;
  std::string master_name;
  /// AUTH towards the sentinels (their own `requirepass` / ACL user); empty: none.
  std::string sentinel_password;
  std::string sentinel_username;
  /// Cluster mode: nodes asked for the slot map (`CLUSTER SLOTS`); any subset of the cluster.
  std::vector<Server> cluster;
  /// A new lock counts as taken only once `WAIT wait_replicas` saw that many replicas
  /// acknowledge it (SPEC C41); 0: no WAIT.
  int wait_replicas = 0;
  Duration operation_timeout = std::chrono::milliseconds(500);
  /// SPEC C58: an `allkeys-*` maxmemory-policy is accepted (a warning) instead of refused.
  bool allow_eviction = false;
};

struct Cleanup {
  Duration interval = std::chrono::minutes(10);
  int batch = 5000;  ///< rows deleted per statement
};

struct Storage {
  Postgres postgres;
  Redis redis;
  Cleanup cleanup;
};

enum class IdempotencyMode { off, optional, required };
enum class Concurrency { reject, wait };
enum class UpstreamKey { passthrough, rewrite, strip };
enum class UnknownOutcome { hold, release };
enum class FingerprintBody { bytes, json };
enum class StoreErrorPolicy { fail_closed, fail_open };

/// Where a route's idempotency key comes from (SPEC C37). Exactly one kind is set.
struct KeySource {
  enum class Kind { header, json_pointer, headers };
  Kind kind = Kind::header;
  std::string header = "Idempotency-Key";  ///< Kind::header
  std::string json_pointer;                ///< Kind::json_pointer, RFC 6901
  std::vector<std::string> headers;        ///< Kind::headers, joined length-prefixed
};

/// `routes[].idempotency` with SPEC §2 defaults.
struct Idempotency {
  IdempotencyMode mode = IdempotencyMode::off;
  std::vector<std::string> methods = {"POST", "PATCH"};
  Duration ttl = std::chrono::hours(24);
  Duration lock_ttl = std::chrono::seconds(30);
  std::vector<std::string> key_scope_headers;
  std::vector<std::string> fingerprint_headers = {"Content-Type", "Content-Encoding"};
  UpstreamKey upstream_key = UpstreamKey::passthrough;
  std::string upstream_key_secret_file;
  std::string upstream_key_secret;  ///< file contents, read by the loader (rewrite only)
  KeySource key_source;
  /// C55: the fields that may carry the key, in order (`key_headers`); with `key_source` set,
  /// its `header` alone, or empty for the other kinds.
  std::vector<std::string> key_headers = {"Idempotency-Key"};
  /// Where the key comes from and its format (C13, C37, C55, C56), as the core reads it; built
  /// by the loader from `key_headers`, `key_source` and `key_format`.
  core::KeySpec key;
  /// C14: whether `upstream_key` acts on the request (the key comes from `key_headers`, or from
  /// `key_source: { header: Idempotency-Key }`); it then acts on every field of `key_headers`.
  bool upstream_key_applies = true;
  int on_mismatch = 422;  ///< 422 | 409 | 400
  Concurrency concurrency = Concurrency::reject;
  Duration wait_timeout = std::chrono::seconds(10);
  /// `concurrency: wait`: requests that may wait for one key on one gateway thread at a time;
  /// more get 409 at once (C18). 0–10000; 0 makes `wait` answer like `reject`.
  std::size_t max_waiters = 32;
  core::StatusSet store_statuses = core::StatusSet::default_storable();
  std::size_t max_stored_response = 8 * 1024 * 1024;  ///< bytes of body
  UnknownOutcome on_unknown_outcome = UnknownOutcome::hold;
  FingerprintBody fingerprint_body = FingerprintBody::bytes;
  StoreErrorPolicy on_store_error = StoreErrorPolicy::fail_closed;
  /// C26: a record commit that fails after the upstream answered is retried (fresh connection,
  /// backoff, lock renewed) for this long before the client gets the answer unrecorded; 0–10min.
  Duration commit_timeout = std::chrono::seconds(10);
  /// C23: how long the committed marker that replaces the lock lives in Redis; 0s–ttl, 0s = no
  /// marker. The default 5m is cut to `ttl` when ttl is shorter.
  Duration replay_cache_ttl = std::chrono::minutes(5);
  /// Responses up to this many bytes (header names + values + body) ride in the marker and replay
  /// without Postgres; 0–1MiB.
  std::size_t replay_cache_max_bytes = 16 * 1024;
};

/// `routes[].cors` (SPEC C57): the gateway answers CORS preflights for the route and adds the
/// Access-Control-* fields to its responses (Fetch standard, "CORS protocol").
struct Cors {
  /// Serialized origins (`https://app.example.com`, lower-case, no path), or {"*"} (any origin,
  /// never with credentials).
  std::vector<std::string> allow_origins;
  /// Methods a preflight may ask for, besides the route's idempotency methods; "*" allowed
  /// without credentials.
  std::vector<std::string> allow_methods = {"GET", "HEAD", "POST"};
  /// Request fields a preflight may ask for, besides the key fields; "*" allowed without
  /// credentials.
  std::vector<std::string> allow_headers;
  /// Response fields a page may read, besides the contract's own (Idempotent-Replayed, …).
  std::vector<std::string> expose_headers;
  /// `Access-Control-Max-Age` in whole seconds; nullopt: not sent (the browser's default).
  std::optional<Duration> max_age;
  bool allow_credentials = false;
};

/// What the idempotency handler keeps for one route (SPEC §4, C57), in its
/// http::Route::handler_config.
struct RouteContract {
  Idempotency idempotency;
  /// Set when the route has a `cors` mapping (SPEC C57); without it the gateway passes
  /// preflights and Access-Control-* fields through untouched.
  std::optional<Cors> cors;
};

/// `route`'s contract; the defaults (mode off, no CORS) for a route that has none.
const RouteContract& contract_of(const Route& route);
/// `route`'s contract, made with the defaults first when it has none (for the loader and tests).
RouteContract& contract_of(Route& route);

/// The whole configuration: what the proxy runs on, and the stores, the admin listener and the
/// loader's findings besides.
struct Config : http::ProxyConfig {
  std::string source_file;  ///< the file this was loaded from
  Listen admin{"127.0.0.1", 9090, {}, {}};
  Storage storage;
  /// Non-fatal findings of the loader, each `FILE:LINE: key.path: message`, for the log.
  std::vector<std::string> warnings;
};

}  // namespace idemgate::config
