// `upstreams.NAME`: the servers a route forwards to, and how connections to them behave.

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {

using namespace std::chrono_literals;

const KeyTable<Upstream>& upstream_keys() {
  static const Upstream d;
  static const KeyTable<Upstream> table = {
      custom_key<Upstream>(
          "servers", "list of `\"host:port\"`", "— (**required**, at least one)",
          "host: a name or IPv4 literal, or an IPv6 literal in brackets (`\"[::1]:9001\"`); port "
          "1–65535; the brackets are removed in the loaded value",
          "C05, C08", "round robin; a connect failure moves to the next server"),
      duration_key("connect_timeout", &Upstream::connect_timeout, d, 10ms, 60s, "C05, C08", ""),
      duration_key("request_timeout", &Upstream::request_timeout, d, 10ms, 1h, "C05",
                   "no response header within it → 504"),
      integer_key("max_idle_connections", &Upstream::max_idle_connections, d, 0, 10'000, "C06",
                  "per io thread; 0 = no pooling"),
      duration_key("idle_timeout", &Upstream::idle_timeout, d, 10ms, 1h, "C08",
                   "keep it below the upstream's keep-alive"),
      size_key("max_response_body", &Upstream::max_response_body, d, 1, 4 * GiB, "",
               "the largest response body the gateway holds (a keyed answer up to the route's "
               "`max_stored_response`); a longer held one → 502"),
      boolean_key("tls", &Upstream::tls, d, "", "TLS 1.2+ to every server of the upstream"),
      custom_key<Upstream>("tls_ca_file", "file (PEM)", "none: the system trust store",
                           "needs `tls: true`", "",
                           "the CA(s) the server certificate must chain to"),
      custom_key<Upstream>("tls_server_name", "host name", "each server's host",
                           "needs `tls: true`", "", "SNI and the name the certificate must carry"),
  };
  return table;
}

void read_upstreams(Loader& loader, const Field& f) {
  const Map m(loader, f, std::vector<std::string_view>{});
  if (m.entries().empty()) loader.fail(f, "at least one upstream is required");
  for (const auto& [name, field] : m.entries()) {
    if (!is_name(name)) {
      loader.fail(field.line, field.path,
                  "an upstream name is 1-64 letters, digits, '.', '_' or '-'");
    }
    Upstream u;
    u.name = name;
    const Map um(loader, field, names_of(upstream_keys()));
    const Field servers = um.require("servers");
    const auto items = loader.sequence(servers);
    if (items.empty()) loader.fail(servers, "at least one \"host:port\" is required");
    for (const Field& item : items) u.servers.push_back(loader.server(item));
    read_keys(loader, um, upstream_keys(), u);
    if (auto v = um.get("tls_ca_file")) {
      if (!u.tls) loader.fail(*v, "needs tls: true");
      u.tls_ca_file = loader.pem_file(*v, Loader::Pem::certificate);
    }
    if (auto v = um.get("tls_server_name")) {
      if (!u.tls) loader.fail(*v, "needs tls: true");
      u.tls_server_name = loader.non_empty(*v);
      if (!is_hostname(u.tls_server_name) && !is_ipv6(u.tls_server_name)) {
        loader.fail(*v, "expected a host name such as payments.internal, got " +
                            in_quotes(u.tls_server_name));
      }
    }
    loader.config().upstreams.emplace(name, std::move(u));
  }
}

}  // namespace idemgate::config::detail
