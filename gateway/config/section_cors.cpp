// `routes[].cors` (SPEC C57): which origins a browser may call the route from, and what the
// gateway tells it in preflights and responses.

#include <algorithm>
#include <boost/url/parse.hpp>

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {

using namespace std::chrono_literals;

const KeyTable<Cors>& cors_keys() {
  static const KeyTable<Cors> table = {
      custom_key<Cors>("allow_origins", "list of origins", "— (**required**)",
                       "`\"*\"` alone, or origins `scheme://host[:port]` without path", "C57",
                       "pages that may call the route; `null` is refused"),
      custom_key<Cors>("allow_methods", "list of methods", "`[GET, HEAD, POST]`",
                       "RFC 9110 tokens, or `\"*\"` without credentials", "C57",
                       "the route's idempotency methods are always allowed besides"),
      custom_key<Cors>("allow_headers", "list of header names", "`[]`",
                       "or `\"*\"` without credentials", "C57",
                       "the key fields are always allowed besides"),
      custom_key<Cors>("expose_headers", "list of header names", "`[]`",
                       "or `\"*\"` without credentials", "C57",
                       "`Idempotent-Replayed`, `Idempotent-Body-Omitted`, `Idempotency-Status` "
                       "and `Retry-After` are always exposed besides"),
      custom_key<Cors>("max_age", "duration", "none (not sent)", "0s – 24h, whole seconds", "C57",
                       "`Access-Control-Max-Age`: how long a browser may cache a preflight"),
      boolean_key("allow_credentials", &Cors::allow_credentials, Cors{}, "C57",
                  "`true`: pages may send cookies and `Authorization`; no `*` anywhere then"),
  };
  return table;
}

namespace {

bool is_scheme_char(char c) {
  return (c >= 'a' && c <= 'z') || is_digit(c) || c == '+' || c == '-' || c == '.';
}

// A serialized origin (RFC 6454 §6.2, Fetch): scheme "://" host [":" port], nothing after.
// Lower-cased: browsers serialize scheme and host in lower case.
std::string origin(Loader& loader, const Field& f) {
  std::string s = to_lower(loader.non_empty(f));
  if (s == "null") {
    loader.fail(f,
                "the null origin cannot be allowed: sandboxed frames and local files of any "
                "site send it");
  }
  const auto sep = s.find("://");
  if (sep == std::string::npos || sep == 0 ||
      !std::all_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(sep), is_scheme_char)) {
    loader.fail(f, "expected an origin such as \"https://app.example.com\", got " +
                       in_quotes(f.node.Scalar()));
  }
  std::string authority = s.substr(sep + 3);
  if (authority.find_first_of("/?#") != std::string::npos) {
    loader.fail(f, "an origin has no path, query or trailing \"/\": write " +
                       in_quotes(s.substr(0, sep + 3) +
                                 authority.substr(0, authority.find_first_of("/?#"))));
  }
  const auto parsed = boost::urls::parse_authority(authority);
  if (!parsed || parsed->has_userinfo()) {
    // What parse_authority refuses after a name: a port that is not digits.
    if (!authority.empty() && authority.front() != '[' &&
        authority.find(':') != std::string::npos) {
      loader.fail(f, "the port must be digits, got " + in_quotes(s));
    }
    loader.fail(
        f, std::string("expected an origin such as \"https://") +
               (!authority.empty() && authority.front() == '[' ? "[::1]:8443" : "app.example.com") +
               "\", got " + in_quotes(s));
  }
  if (parsed->has_port() && (parsed->port().empty() || parsed->port().size() > 5)) {
    loader.fail(f, "the port must be digits, got " + in_quotes(s));
  }
  const std::string_view host = parsed->encoded_host_address();
  const bool valid = parsed->host_type() == boost::urls::host_type::ipv6 ||
                     (parsed->host_type() != boost::urls::host_type::ipvfuture &&
                      is_hostname(host) && host.front() != '.' && host.back() != '.');
  if (!valid) {
    loader.fail(f, "expected an origin such as \"https://app.example.com\", got " + in_quotes(s));
  }
  return s;
}

// A list of tokens or the one wildcard "*".
std::vector<std::string> tokens_or_star(Loader& loader, const Field& f, std::string_view what,
                                        bool allow_empty) {
  const auto items = loader.sequence(f);
  for (const auto& item : items) {
    if (item.node.IsScalar() && item.node.Scalar() == "*") {
      if (items.size() > 1)
        loader.fail(item, "\"*\" stands alone: it already allows every " + std::string(what));
      return {"*"};
    }
  }
  return loader.tokens(f, what, allow_empty);
}

}  // namespace

void read_cors(Loader& loader, const Field& f, Route& route) {
  const Map m(loader, f, names_of(cors_keys()));
  Cors cors;
  read_keys(loader, m, cors_keys(), cors);
  const Field origins = m.require("allow_origins");
  const auto items = loader.sequence(origins);
  if (items.empty()) loader.fail(origins, "at least one origin (or \"*\") is required");
  for (const auto& item : items) {
    if (item.node.IsScalar() && item.node.Scalar() == "*") {
      if (items.size() > 1) {
        loader.fail(item, "\"*\" stands alone: it already allows every origin");
      }
      cors.allow_origins = {"*"};
      break;
    }
    std::string o = origin(loader, item);
    for (const auto& seen : cors.allow_origins) {
      if (seen == o) loader.fail(item, "duplicate origin " + in_quotes(o));
    }
    cors.allow_origins.push_back(std::move(o));
  }
  if (auto v = m.get("allow_methods"))
    cors.allow_methods = tokens_or_star(loader, *v, "method", false);
  if (auto v = m.get("allow_headers")) {
    cors.allow_headers = tokens_or_star(loader, *v, "header name", true);
  }
  if (auto v = m.get("expose_headers")) {
    cors.expose_headers = tokens_or_star(loader, *v, "header name", true);
  }
  if (auto v = m.get("max_age")) {
    const Duration d = loader.duration(*v, 0ms, 24h);
    if (d.count() % 1000 != 0) loader.fail(*v, "must be whole seconds (Access-Control-Max-Age)");
    cors.max_age = d;
  }
  // Fetch: with credentials a "*" is not a wildcard, and a browser refuses the response.
  if (cors.allow_credentials) {
    for (const char* key : {"allow_origins", "allow_methods", "allow_headers", "expose_headers"}) {
      const auto v = m.get(key);
      if (!v) continue;
      const auto& list = std::string_view(key) == "allow_origins"   ? cors.allow_origins
                         : std::string_view(key) == "allow_methods" ? cors.allow_methods
                         : std::string_view(key) == "allow_headers" ? cors.allow_headers
                                                                    : cors.expose_headers;
      if (list.size() == 1 && list.front() == "*") {
        loader.fail(*v,
                    "\"*\" cannot be used with allow_credentials: true (the Fetch standard "
                    "forbids it; browsers reject the response): list the values");
      }
    }
  }
  contract_of(route).cors = std::move(cors);
}

}  // namespace idemgate::config::detail
