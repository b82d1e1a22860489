// `routes[]`: matching, the upstream, upgrades; the idempotency block has its own file.

#include <algorithm>

#include "gateway/config/loader.hpp"
#include "gateway/http/router.hpp"

namespace idemgate::config::detail {

const KeyTable<Route>& route_keys() {
  static const KeyTable<Route> table = {
      custom_key<Route>("name", "name", "— (**required**)", "unique among routes", "§4",
                        "metrics label, key scope"),
      custom_key<Route>("match", "mapping", "— (**required**)", "", "C01", ""),
      custom_key<Route>("match.path_prefix", "string", "none",
                        "starts with `/`; no spaces, `?` or `#`", "C01",
                        "exactly one of `path_prefix` and `path` is required (`path_prefix: /` "
                        "matches everything); compared with the request's normalized path (see "
                        "\"Route matching\")"),
      custom_key<Route>("match.path", "string", "none", "same syntax as `path_prefix`", "C01",
                        "the exact path"),
      custom_key<Route>("match.host", "host name", "any", "no port", "C01",
                        "`*.example.com` matches any subdomain; stored lower-cased (matching is "
                        "case-insensitive)"),
      custom_key<Route>("match.methods", "list of methods", "any",
                        "non-empty when present; no duplicates", "C01", ""),
      custom_key<Route>("upstream", "string", "— (**required**)", "a key of `upstreams`", "", ""),
      custom_key<Route>("idempotency", "mapping", "all defaults (mode off)", "", "§4",
                        "see `routes[].idempotency`"),
      custom_key<Route>("upgrade", "list of protocols", "`[]`", "only `websocket`", "C40",
                        "WebSocket upgrades are tunnelled on this route"),
      custom_key<Route>("cors", "mapping", "none: preflights and `Access-Control-*` pass through",
                        "see `routes[].cors`", "C57",
                        "the gateway answers preflights and sets the CORS fields"),
      custom_key<Route>("max_in_flight", "integer", "none (no bound)", "1 – 1000000", "C53",
                        "requests of the route in progress at once; past it → 503 `overloaded` "
                        "with `Retry-After`, before any lock or record (outcome `shed`)"),
  };
  return table;
}

namespace {

void read_match(Loader& loader, const Field& f, Match& out) {
  const Map m(loader, f, names_of(route_keys(), "match"));
  auto path_value = [&loader](const Field& v) {
    std::string p = loader.non_empty(v);
    if (p.front() != '/') loader.fail(v, "must start with \"/\", got " + in_quotes(p));
    for (char c : p) {
      if (c <= ' ' || c == 0x7f || c == '?' || c == '#') {
        loader.fail(v,
                    "must be a plain path without spaces, query or fragment, got " + in_quotes(p));
      }
    }
    // Requests are matched in normal form (router.hpp): a path in another form matches nothing.
    std::string scratch;
    if (const auto normal = http::normalized_path(p, scratch); normal != p) {
      loader.fail(v,
                  "must be in normal form (no \"//\", \".\" or \"..\" segments, no escaped "
                  "letters, digits or -._~), write " +
                      in_quotes(std::string(normal)) + " for " + in_quotes(p));
    }
    return p;
  };
  const auto prefix = m.get("path_prefix");
  const auto exact = m.get("path");
  if (prefix && exact) loader.fail(*exact, "set either path or path_prefix, not both");
  if (!prefix && !exact)
    loader.fail(f, "needs path_prefix or path (use path_prefix: / to match all)");
  if (prefix) out.path_prefix = path_value(*prefix);
  if (exact) out.path = path_value(*exact);
  if (auto h = m.get("host")) {
    std::string host = to_lower(loader.non_empty(*h));
    const std::string_view name = std::string_view(host).substr(host.rfind("*.", 0) == 0 ? 2 : 0);
    if (!is_hostname(name) || name.front() == '.' || name.back() == '.') {
      loader.fail(*h, "expected a host name without port, optionally \"*.\" first, got " +
                          in_quotes(h->node.Scalar()));
    }
    out.host = std::move(host);
  }
  if (auto v = m.get("methods")) out.methods = loader.tokens(*v, "method", false);
}

}  // namespace

void read_routes(Loader& loader, const Field& f) {
  const auto items = loader.sequence(f);
  if (items.empty()) loader.fail(f, "at least one route is required");
  std::vector<std::pair<std::string, int>> names;  // name, line
  for (const Field& item : items) {
    const Map m(loader, item, names_of(route_keys()));
    Route route;
    const Field name = m.require("name");
    route.name = loader.non_empty(name);
    if (!is_name(route.name))
      loader.fail(name, "a route name is 1-64 letters, digits, '.', '_' or '-'");
    for (const auto& [seen, line] : names) {
      if (seen == route.name) {
        loader.fail(name, "duplicate route name " + in_quotes(seen) + " (first at line " +
                              std::to_string(line) + ")");
      }
    }
    names.emplace_back(route.name, name.line);

    read_match(loader, m.require("match"), route.match);

    const Field upstream = m.require("upstream");
    route.upstream = loader.non_empty(upstream);
    if (loader.config().upstreams.count(route.upstream) == 0) {
      std::string known;
      for (const auto& [n, u] : loader.config().upstreams) known += (known.empty() ? "" : ", ") + n;
      loader.fail(upstream,
                  "no upstream named " + in_quotes(route.upstream) + " (defined: " + known + ")");
    }

    if (auto v = m.get("idempotency")) read_idempotency(loader, *v, route);
    if (auto v = m.get("upgrade")) {
      // SPEC C40: WebSocket is the one protocol tunnelled; h2c and the rest stay hop-by-hop.
      route.upgrade = loader.tokens(*v, "protocol", true);
      for (auto& protocol : route.upgrade) {
        protocol = to_lower(protocol);
        if (protocol != "websocket") {
          loader.fail(*v, "the only protocol that can be upgraded to is websocket, got " +
                              in_quotes(protocol));
        }
      }
    }
    if (auto v = m.get("cors")) read_cors(loader, *v, route);
    if (auto v = m.get("max_in_flight")) {
      route.max_in_flight = static_cast<std::size_t>(loader.integer(*v, 1, 1'000'000));
    }
    loader.config().routes.push_back(std::move(route));
  }
}

}  // namespace idemgate::config::detail
