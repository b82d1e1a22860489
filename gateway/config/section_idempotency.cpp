// `routes[].idempotency`: the contract's settings for one route (SPEC §2, §4, C37).

#include <algorithm>
#include <cstring>
#include <optional>

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {

using namespace std::chrono_literals;

const KeyTable<Idempotency>& idempotency_keys() {
  static const Idempotency d;
  static const KeyTable<Idempotency> table = {
      custom_key<Idempotency>("mode", "enum", "`off`", "`off` \\| `optional` \\| `required`",
                              "C10, C11", ""),
      custom_key<Idempotency>("methods", "list of methods", "`[POST, PATCH]`",
                              "non-empty, no duplicates", "C12",
                              "methods the contract applies to; others pass through"),
      custom_key<Idempotency>("ttl", "duration", "`" + format_duration(d.ttl) + "`", "1s – 8760h",
                              "C16, C24",
                              "record retention; outside 24h–72h warns (seed R-DIST-IDEM-5)"),
      custom_key<Idempotency>("lock_ttl", "duration", "`" + format_duration(d.lock_ttl) + "`",
                              "1s – 10m", "C22, C23",
                              "the in-flight lock, renewed every lock_ttl/3; under 3 × "
                              "`storage.redis.operation_timeout` warns"),
      custom_key<Idempotency>("key_scope.headers", "list of header names", "`[]`", "may be empty",
                              "C20", "client identity that namespaces keys"),
      custom_key<Idempotency>("fingerprint.headers", "list of header names",
                              "`[Content-Type, Content-Encoding]`", "may be empty", "C17, C27",
                              "fingerprinted besides method, target and body"),
      custom_key<Idempotency>("upstream_key", "enum", "`passthrough`",
                              "`passthrough` \\| `rewrite` \\| `strip`", "C14",
                              "what the upstream sees of the key"),
      custom_key<Idempotency>("upstream_key_secret_file", "file", "none",
                              "**required when `upstream_key: rewrite`**", "C14",
                              "read at load time; must not be empty once trailing CR/LF are "
                              "removed; fewer than 32 bytes warns; ignored for other values"),
      custom_key<Idempotency>("key_source", "mapping with exactly one key",
                              "`{ header: Idempotency-Key }`", "see below; not with `key_headers`",
                              "C37", "where the key comes from, when not from `key_headers`"),
      custom_key<Idempotency>("key_headers", "list of header names", "`[Idempotency-Key]`",
                              "non-empty, no duplicates; not with `key_source`", "C55",
                              "fields that may carry the key; the first present names it, two "
                              "present with different values → 400"),
      custom_key<Idempotency>("key_format", "`any` \\| `uuid` \\| `{ pattern: REGEX }`", "`any`",
                              "REGEX: Perl syntax, matched against the whole key", "C56",
                              "checked after C13's decoding; a key that fails → 400 `invalid-key`"),
      enum_key<Idempotency, int>("on_mismatch", &Idempotency::on_mismatch, d,
                                 {{"422", 422}, {"409", 409}, {"400", 400}}, "C17",
                                 "status of the mismatch answer"),
      custom_key<Idempotency>("concurrency", "enum", "`reject`", "`reject` \\| `wait`", "C18, C19",
                              "`reject` → 409; `wait` → wait and replay"),
      custom_key<Idempotency>("wait_timeout", "duration",
                              "`" + format_duration(d.wait_timeout) + "`", "10ms – 20m", "C18",
                              "with `concurrency: wait` also ≤ 2 × `lock_ttl` (see decisions)"),
      integer_key("max_waiters", &Idempotency::max_waiters, d, 0, 10'000, "C18",
                  "requests that may wait for one key at a time on one gateway thread with "
                  "`concurrency: wait`; the next gets the 409 at once; 0 = never wait (see "
                  "decisions)"),
      custom_key<Idempotency>(
          "store_statuses", "string", "`\"200-400,402,404-406,409-424,426-428,430-499\"`",
          "codes and inclusive ranges, 100–599, comma-separated, spaces allowed; not "
          "empty",
          "C21", "statuses whose responses are stored"),
      size_key("max_stored_response", &Idempotency::max_stored_response, d, 0, 256 * MiB,
               "C29, C39",
               "bytes of body held and stored; a longer answer is committed without its body, "
               "then streamed to the client; 0 = always store without body"),
      enum_key<Idempotency, UnknownOutcome>(
          "on_unknown_outcome", &Idempotency::on_unknown_outcome, d,
          {{"hold", UnknownOutcome::hold}, {"release", UnknownOutcome::release}}, "C22",
          "`hold` keeps the lock until `lock_ttl`; `release` frees it at once"),
      enum_key<Idempotency, FingerprintBody>(
          "fingerprint_body", &Idempotency::fingerprint_body, d,
          {{"bytes", FingerprintBody::bytes}, {"json", FingerprintBody::json}}, "C35",
          "`json`: canonical JSON (sorted keys, no insignificant space)"),
      enum_key<Idempotency, StoreErrorPolicy>(
          "on_store_error", &Idempotency::on_store_error, d,
          {{"fail_closed", StoreErrorPolicy::fail_closed},
           {"fail_open", StoreErrorPolicy::fail_open}},
          "C25", "`fail_closed` → 503; `fail_open` → forwarded without dedup"),
      duration_key("commit_timeout", &Idempotency::commit_timeout, d, 0ms, 10min, "C26",
                   "how long a record commit that failed after the upstream answered is retried "
                   "(backoff 50 ms doubling to 1 s, jittered; a fresh Postgres connection each "
                   "time; the lock renewed) before the client gets the answer unrecorded and the "
                   "lock is left to expire; 0s = one attempt"),
      custom_key<Idempotency>(
          "replay_cache_ttl", "duration",
          "`" + format_duration(d.replay_cache_ttl) + "` (cut to `ttl` when shorter)", "0s – `ttl`",
          "C16, C23",
          "how long the committed marker that replaces the lock in Redis lives (see "
          "\"The committed marker\"); 0s = no marker, every replay reads "
          "Postgres"),
      size_key("replay_cache_max_bytes", &Idempotency::replay_cache_max_bytes, d, 0, MiB,
               "C16, C23",
               "a stored response up to this size (header names and values plus body) rides in "
               "the marker and replays without Postgres; a larger one leaves a marker with the "
               "fingerprint only"),
  };
  return table;
}

namespace {

void read_secret(Loader& loader, const Field& f, Idempotency& out) {
  constexpr std::size_t kMaxSecretBytes = 64 * 1024;
  auto file = loader.file_contents(f, kMaxSecretBytes);
  out.upstream_key_secret_file = std::move(file.path);
  std::string secret = std::move(file.bytes);
  // Editors add a final newline; it is not part of the key.
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty())
    loader.fail(f, "the file " + in_quotes(out.upstream_key_secret_file) + " is empty");
  if (secret.size() < 32) {
    loader.warn(f, "the secret has " + std::to_string(secret.size()) +
                       " bytes; HMAC-SHA-256 wants at least 32 (RFC 2104 §3)");
  }
  out.upstream_key_secret = std::move(secret);
}

}  // namespace

void read_idempotency(Loader& loader, const Field& f, Route& route) {
  const Map m(loader, f, names_of(idempotency_keys()));
  Idempotency& idem = contract_of(route).idempotency;
  if (auto v = m.get("mode")) {
    idem.mode = loader.choice<IdempotencyMode>(*v, {{"off", IdempotencyMode::off},
                                                    {"optional", IdempotencyMode::optional},
                                                    {"required", IdempotencyMode::required}});
  }
  const auto methods = m.get("methods");
  if (methods) {
    idem.methods = loader.tokens(*methods, "method", false);
    // C57: a CORS preflight carries no key and must reach whoever answers it.
    if (std::find(idem.methods.begin(), idem.methods.end(), "OPTIONS") != idem.methods.end()) {
      loader.fail(*methods,
                  "OPTIONS is never keyed (SPEC C57): browsers send preflights "
                  "without a key");
    }
  }
  if (!route.match.methods.empty() && idem.mode != IdempotencyMode::off &&
      std::none_of(idem.methods.begin(), idem.methods.end(), [&](const std::string& x) {
        return std::find(route.match.methods.begin(), route.match.methods.end(), x) !=
               route.match.methods.end();
      })) {
    loader.warn(methods ? *methods : f,
                "none of the idempotency methods is in match.methods: the contract never applies");
  }
  if (auto v = m.get("ttl")) {
    idem.ttl = loader.duration(*v, 1s, 8760h);
    if (idem.ttl < 24h || idem.ttl > 72h) {
      loader.warn(*v,
                  "ttl " + format_duration(idem.ttl) +
                      " is outside 24h-72h: shorter lets late retries execute again, longer keeps "
                      "records past any client's retry window (seed R-DIST-IDEM-5)");
    }
  }
  const auto lock_ttl_field = m.get("lock_ttl");
  if (lock_ttl_field) idem.lock_ttl = loader.duration(*lock_ttl_field, 1s, 10min);
  if (idem.mode != IdempotencyMode::off &&
      loader.config().storage.redis.operation_timeout * 3 > idem.lock_ttl) {
    loader.warn(
        lock_ttl_field ? *lock_ttl_field : f,
        "lock_ttl " + format_duration(idem.lock_ttl) +
            " is under 3 x storage.redis.operation_timeout: one slow renewal can let the lock "
            "expire");
  }
  if (auto v = m.get("key_scope")) {
    const Map scope(loader, *v, {"headers"});
    if (auto h = scope.get("headers"))
      idem.key_scope_headers = loader.tokens(*h, "header name", true);
  }
  if (auto v = m.get("fingerprint")) {
    const Map fp(loader, *v, {"headers"});
    if (auto h = fp.get("headers"))
      idem.fingerprint_headers = loader.tokens(*h, "header name", true);
  }
  read_key_settings(loader, m, idem);
  for (const auto* list : {&idem.key_scope_headers, &idem.fingerprint_headers}) {
    if (!loader.config().request_id.generate) break;
    for (const auto& h : *list) {
      if (!iequals(h, loader.config().request_id.header)) continue;
      loader.warn(
          m.get(list == &idem.key_scope_headers ? "key_scope" : "fingerprint").value_or(f),
          h + " differs from request to request when the gateway generates it (request_id): "
              "retries of one operation would not be recognised");
    }
  }

  const auto upstream_key = m.get("upstream_key");
  if (upstream_key) {
    idem.upstream_key =
        loader.choice<UpstreamKey>(*upstream_key, {{"passthrough", UpstreamKey::passthrough},
                                                   {"rewrite", UpstreamKey::rewrite},
                                                   {"strip", UpstreamKey::strip}});
  }
  const auto secret_file = m.get("upstream_key_secret_file");
  if (idem.upstream_key == UpstreamKey::rewrite) {
    if (!secret_file) {
      loader.fail(upstream_key->line, join(f.path, "upstream_key_secret_file"),
                  "required when upstream_key is rewrite");
    }
    read_secret(loader, *secret_file, idem);
  } else if (secret_file) {
    idem.upstream_key_secret_file = loader.non_empty(*secret_file);
  }
  if (upstream_key && idem.upstream_key != UpstreamKey::passthrough && !idem.upstream_key_applies) {
    loader.warn(*upstream_key,
                "has no effect: upstream_key applies to the Idempotency-Key source only "
                "(SPEC C37)");
  }

  const auto concurrency = m.get("concurrency");
  if (concurrency) {
    idem.concurrency = loader.choice<Concurrency>(
        *concurrency, {{"reject", Concurrency::reject}, {"wait", Concurrency::wait}});
  }
  const auto wait_timeout = m.get("wait_timeout");
  if (wait_timeout) idem.wait_timeout = loader.duration(*wait_timeout, 10ms, 20min);
  // A held unknown outcome (C22) lapses within one lock_ttl; a waiter still blocked after two is
  // behind a slow upstream whose lock keeps being renewed, and a 409 with Retry-After serves the
  // client better than a connection held open (conf/REFERENCE.md).
  if (idem.concurrency == Concurrency::wait && idem.wait_timeout > 2 * idem.lock_ttl) {
    const std::string bound = format_duration(2 * idem.lock_ttl);
    const std::string value = format_duration(idem.wait_timeout);
    if (wait_timeout) {
      loader.fail(*wait_timeout, "must not exceed 2 x lock_ttl (" + bound + "), got " + value);
    }
    loader.fail(
        concurrency->line, join(f.path, "wait_timeout"),
        "wait_timeout " + value + " exceeds 2 x lock_ttl (" + bound + "); set wait_timeout");
  }
  // C23: the committed marker never outlives its record.
  if (auto v = m.get("replay_cache_ttl")) {
    idem.replay_cache_ttl = loader.duration(*v, 0ms, 8760h);
    if (idem.replay_cache_ttl > idem.ttl) {
      loader.fail(*v, "must not exceed ttl (" + format_duration(idem.ttl) + "), got " +
                          format_duration(idem.replay_cache_ttl));
    }
  } else {
    idem.replay_cache_ttl = std::min(idem.replay_cache_ttl, idem.ttl);
  }
  if (auto v = m.get("store_statuses")) {
    std::string error;
    auto set = core::StatusSet::parse(loader.scalar(*v), error);
    if (!set) loader.fail(*v, error);
    idem.store_statuses = *set;
  }
  read_keys(loader, m, idempotency_keys(), idem);
}

}  // namespace idemgate::config::detail
