#pragma once
// Route selection (SPEC §2 "Routes are tried in file order", C01).

#include <string>
#include <string_view>

#include "gateway/http/settings.hpp"

namespace idemgate::http {

/// The first route of `config.routes` (file order) whose `host`, path and `methods` all match,
/// or nullptr (→ 404, SPEC C01).
/// - `host`: the `Host` value; its port is ignored and names compare case-insensitively. A route
///   host `*.example.com` matches any subdomain (`a.example.com`, `a.b.example.com`) but not
///   `example.com` itself. An empty route host matches any request, with or without `Host`.
/// - `path`: the request path without query, compared in its normalized form (normalized_path:
///   `/%70ayments`, `/a/../payments` and `//payments` all select the route of `/payments`);
///   `match.path` must equal it, `match.path_prefix` must be a prefix of it (plain string prefix:
///   `/pay` matches `/payments`). Both may be set.
/// - `method`: compared case-sensitively (RFC 9110 §9.1); empty `methods` accept any.
/// The result points into `config`. Pure; thread-safe.
const Route* match(const ProxyConfig& config, std::string_view host, std::string_view path,
                   std::string_view method);

/// `path` as routes see it (RFC 3986 §6.2.2): percent-encoded unreserved characters decoded
/// (`%70` → `p`; other escapes kept, their hex digits upper-cased; a `%` that starts no escape
/// becomes `%25`), runs of `/` merged into one
/// and `.` and `..` segments removed (§5.2.4; a `..` above the root is dropped), so that a path
/// an upstream resolves to `/payments` cannot pass a gateway route under another name. Returns
/// `path` itself when it is already normal (the usual case, no copy), else a view of `scratch`.
/// A path that does not start with `/` (`*`) is returned as given. Normalizing a result again
/// leaves it as it is. Pure.
std::string_view normalized_path(std::string_view path, std::string& scratch);

/// The path of a request target: origin-form `/a/b?q` → `/a/b`; absolute-form
/// `http://h/a?q` → `/a` (`/` when empty); anything else (`*`, authority-form) → as given.
std::string_view target_path(std::string_view target);

}  // namespace idemgate::http
