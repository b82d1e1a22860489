// `storage`: the record store (Postgres), the lock store (Redis, in one of three shapes) and
// the cleaner.

#include <limits>
#include <string>

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {

using namespace std::chrono_literals;

const KeyTable<Postgres>& postgres_keys() {
  static const Postgres d;
  static const KeyTable<Postgres> table = {
      custom_key<Postgres>("dsn", "string", "— (**required**, non-empty)",
                           "a libpq connection string or URI", "C15, C24, C43",
                           "checked by libpq at connect; for a primary with standbys, libpq's "
                           "multi-host form (see below)"),
      custom_key<Postgres>("pool_size", "integer", "`" + std::to_string(d.pool_size) + "`",
                           "1 – 256", "",
                           "connections per process, spread over the io threads; below "
                           "`threads` warns"),
      duration_key("operation_timeout", &Postgres::operation_timeout, d, 10ms, 60s, "C25",
                   "every statement, connect included"),
      boolean_key("prepared_statements", &Postgres::prepared_statements, d, "C44",
                  "`true`: named statements, and each request session sets `statement_timeout`, "
                  "`enable_seqscan = off` (a lookup prepared while the table was empty stays on "
                  "the primary key) and `plan_cache_mode = force_generic_plan` (a batch of keys "
                  "is planned once; Postgres 12 or later); `false`: unnamed statements only "
                  "(each planned as it runs) and no session state, for PgBouncer with "
                  "`pool_mode = transaction`; no per-session `statement_timeout` then (set one "
                  "on the role, or PgBouncer's `query_timeout`)"),
      integer_key(
          "max_pending", &Postgres::max_pending, d, 1, 1'000'000, "C54",
          "records waiting for their commit at once (each keyed request that may execute "
          "holds a place from before its lock to its commit); while full, new keyed "
          "requests get 503 `overloaded` with `Retry-After` before any lock; read at start"),
  };
  return table;
}

const KeyTable<Redis>& redis_keys() {
  static const Redis d;
  static const KeyTable<Redis> table = {
      custom_key<Redis>("address", "host name or IP", "`" + d.address + "`",
                        "no port here (`redis.port`); an IPv6 literal is written bare", "C23",
                        "the single-server shape only"),
      custom_key<Redis>("port", "port", "`" + std::to_string(d.port) + "`", "1 – 65535", "C23",
                        "the single-server shape only"),
      custom_key<Redis>("db", "integer", "`0`", "0 – 2147483647", "",
                        "the server's `databases` setting is the real bound (SELECT fails at "
                        "connect); a cluster has only db 0"),
      custom_key<Redis>("password", "string", "empty = no AUTH", "any", "", ""),
      custom_key<Redis>(
          "username", "string", "empty = the default user", "needs `password`", "C25",
          "a Redis 6+ ACL user: `AUTH username password` first on every connection; it needs "
          "`set`, `get`, `eval`, `evalsha`, `pexpire`, `del`, `ping`, `client\\|id` and "
          "`client\\|kill` (and `select` with a `db`; `wait` with `wait_replicas`) on keys "
          "`idemgate:lock:*`, and `config\\|get` for the C58 eviction check (without it the "
          "check reports \"could not run\"). Without `client\\|id`/`client\\|kill` a lock "
          "command whose reply was lost is still undone, but without first closing the "
          "connection it went out on, so a write that connection delivers later than the undo "
          "can stay until `lock_ttl`"),
      duration_key("operation_timeout", &Redis::operation_timeout, d, 10ms, 60s, "C25",
                   "every command, connect included"),
      custom_key<Redis>("sentinels", "list of `\"host:port\"`", "—",
                        "at least one; not with `address`/`port` or `cluster`", "C41",
                        "the Sentinel shape: asked in turn for the primary of `master_name`"),
      custom_key<Redis>("master_name", "string", "— (**required** with `sentinels`)", "", "C41",
                        "the name the sentinels monitor"),
      custom_key<Redis>("sentinel_password", "string", "empty = no AUTH", "only with `sentinels`",
                        "C41", "the sentinels' own `requirepass` (or ACL password)"),
      custom_key<Redis>("sentinel_username", "string", "empty = the default user",
                        "needs `sentinel_password`", "C41", "an ACL user on the sentinels"),
      custom_key<Redis>("cluster", "list of `\"host:port\"`", "—",
                        "at least one; not with `address`/`port`, `sentinels` or a non-zero `db`",
                        "C42",
                        "the Redis Cluster shape: seed nodes asked for the slot map "
                        "(`CLUSTER SLOTS`), any subset of the cluster"),
      integer_key("wait_replicas", &Redis::wait_replicas, d, 0, 16, "C41",
                  "a new lock counts as taken only once `WAIT N` saw N replicas acknowledge it "
                  "(its timeout is ¾ of `operation_timeout`); fewer → the lock is released and "
                  "the request gets `on_store_error`"),
      boolean_key("allow_eviction", &Redis::allow_eviction, d, "C58",
                  "`true`: start even when `maxmemory-policy` is `allkeys-*` (a warning instead "
                  "of a refusal): an evicted lock can let a retry execute twice"),
  };
  return table;
}

const KeyTable<Cleanup>& cleanup_keys() {
  static const Cleanup d;
  static const KeyTable<Cleanup> table = {
      duration_key("interval", &Cleanup::interval, d, 1s, 24h, "C24",
                   "time between two runs of the cleaner"),
      integer_key("batch", &Cleanup::batch, d, 1, 1'000'000, "C24", "rows per DELETE"),
  };
  return table;
}

void read_storage(Loader& loader, const Field& f) {
  const Map m(loader, f, {"postgres", "redis", "cleanup"});
  Storage& s = loader.config().storage;

  const Field pg_field = m.require("postgres");
  const Map pg(loader, pg_field, names_of(postgres_keys()));
  s.postgres.dsn = loader.non_empty(pg.require("dsn"));
  if (auto v = pg.get("pool_size")) {
    s.postgres.pool_size = static_cast<int>(loader.integer(*v, 1, 256));
    if (s.postgres.pool_size < loader.config().threads) {
      loader.warn(*v, "pool_size " + std::to_string(s.postgres.pool_size) + " is below threads (" +
                          std::to_string(loader.config().threads) +
                          "): every io thread needs at least one connection of its own");
    }
  }
  read_keys(loader, pg, postgres_keys(), s.postgres);

  if (auto r = m.get("redis")) {
    const Map redis(loader, *r, names_of(redis_keys()));
    // One shape only (SPEC C41, C42): a single server, sentinels, or a cluster.
    const auto address = redis.get("address");
    const auto port_field = redis.get("port");
    const auto sentinels = redis.get("sentinels");
    const auto cluster = redis.get("cluster");
    if (sentinels && cluster) {
      loader.fail(*cluster,
                  "redis.cluster and redis.sentinels are two different shapes of "
                  "storage.redis: keep one of them");
    }
    if (sentinels || cluster) {
      const char* shape = sentinels ? "redis.sentinels" : "redis.cluster";
      if (address) {
        loader.fail(*address,
                    std::string("redis.address names a single server and cannot be combined "
                                "with ") +
                        shape + ": keep one of them");
      }
      if (port_field) {
        loader.fail(*port_field, std::string("redis.port belongs to redis.address and cannot be "
                                             "combined with ") +
                                     shape + ": keep one of them");
      }
    }
    if (address) {
      std::string a = loader.non_empty(*address);
      if (a.find(':') != std::string::npos ? !is_ipv6(a) : !is_hostname(a)) {
        loader.fail(*address, "expected a host name or IP address (the port goes in redis.port), " +
                                  describe(address->node));
      }
      s.redis.address = std::move(a);
    }
    if (port_field) s.redis.port = loader.port(*port_field, false);
    if (sentinels) {
      s.redis.mode = Redis::Mode::sentinel;
      const auto items = loader.sequence(*sentinels);
      if (items.empty()) loader.fail(*sentinels, "at least one sentinel \"host:port\" is required");
      for (const Field& item : items) s.redis.sentinels.push_back(loader.server(item));
      s.redis.master_name = loader.non_empty(redis.require("master_name"));
    } else {
      for (const char* key : {"master_name", "sentinel_password", "sentinel_username"}) {
        if (auto v = redis.get(key)) {
          loader.fail(*v,
                      std::string("redis.") + key + " needs redis.sentinels (the Sentinel shape)");
        }
      }
    }
    if (cluster) {
      s.redis.mode = Redis::Mode::cluster;
      const auto items = loader.sequence(*cluster);
      if (items.empty())
        loader.fail(*cluster, "at least one cluster node \"host:port\" is required");
      for (const Field& item : items) s.redis.cluster.push_back(loader.server(item));
    }
    if (auto v = redis.get("db")) {
      s.redis.db = static_cast<int>(loader.integer(*v, 0, std::numeric_limits<int>::max()));
      if (cluster && s.redis.db != 0) {
        loader.fail(*v, "a Redis Cluster has only db 0: remove redis.db or set it to 0");
      }
    }
    if (auto v = redis.get("password")) s.redis.password = loader.scalar(*v);
    if (auto v = redis.get("username")) {
      s.redis.username = loader.scalar(*v);
      // An ACL user authenticates with both (AUTH username password, Redis >= 6).
      if (!s.redis.username.empty() && s.redis.password.empty()) {
        loader.fail(*v, "an ACL username needs redis.password as well");
      }
    }
    if (auto v = redis.get("sentinel_password")) s.redis.sentinel_password = loader.scalar(*v);
    if (auto v = redis.get("sentinel_username")) {
      s.redis.sentinel_username = loader.scalar(*v);
      if (!s.redis.sentinel_username.empty() && s.redis.sentinel_password.empty()) {
        loader.fail(*v, "an ACL sentinel_username needs redis.sentinel_password as well");
      }
    }
    read_keys(loader, redis, redis_keys(), s.redis);
  }

  if (auto c = m.get("cleanup")) {
    const Map cleanup(loader, *c, names_of(cleanup_keys()));
    read_keys(loader, cleanup, cleanup_keys(), s.cleanup);
  }
}

}  // namespace idemgate::config::detail
