#pragma once
// `idemgate keys show|purge`: look at or delete one idempotency record (and its in-flight lock)
// from the command line, for operators answering "what did the gateway store for this key?".

#include <ostream>
#include <string>
#include <vector>

#include "gateway/config/config.hpp"

namespace idemgate::admin {

/// One `keys` invocation.
struct KeysRequest {
  enum class Action { show, purge };
  Action action = Action::show;
  std::string route;  ///< a route name of the configuration
  /// `Name: value` fields standing in for the client's key_scope headers (e.g. Authorization),
  /// in order; repeated names give repeated values.
  std::vector<std::string> scope_headers;
  /// The key as the client sent it: one Idempotency-Key (or other header) value, parsed like the
  /// header (`"abc"` and `abc` are the same key, C28); for a `key_source.headers` route one value
  /// per configured header, in order; for a `json_pointer` route the JSON value (`'"evt_1"'` or
  /// `42`).
  std::vector<std::string> key;
};

/// Exit statuses of run_keys.
inline constexpr int kKeysFound = 0;
inline constexpr int kKeysNotFound = 1;  ///< also: a store could not be reached
inline constexpr int kKeysBadArguments = 2;

/// Derives the record id exactly as the gateway does (request_scope + core::record_id over the
/// route's key source), then:
/// - show: prints the live record (`id`, `route`, `status`, `created`, `expires` in UTC RFC 3339,
///   `fingerprint` hex, `body_size` bytes, `body_omitted`, `lock` held/free and `replay_marker`
///   present/absent, SPEC C23) one `name value` per line on `out` → 0; no live record → "not
///   found" → 1.
/// - purge: deletes the record (live or expired) and the Redis key (the in-flight lock or the
///   committed marker), printing what it deleted → 0; neither existed → "not found" → 1. A request
///   still in flight for the key is not stopped: it commits its record when it finishes.
/// Unknown route, a route without idempotency or an invalid key → message on `err`, 2. A store
/// error → message on `err`, 1. Runs the gateway's own record store and Redis client on an
/// io_context of its own until each answer is in (blocking: for the CLI only); their log lines go
/// to the default logger.
int run_keys(const config::Config& config, const KeysRequest& request, std::ostream& out,
             std::ostream& err);

}  // namespace idemgate::admin
