// The top level and its small sections: `listen`, `admin`, `threads`, `limits`, `request_id`.

#include <algorithm>
#include <string_view>

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {

using namespace std::chrono_literals;

namespace {

// Fields the gateway sets, strips or reads itself, and credentials: a generated request id
// written over any of them would break the request.
constexpr std::string_view kNotRequestIdFields[] = {
    // hop-by-hop (SPEC C02)
    "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    "Proxy-Authorization", "Proxy-Authenticate",
    // set or read by the proxy
    "Host", "Content-Length", "Content-Type", "Content-Encoding", "Expect", "Date", "Via",
    "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "traceparent", "tracestate",
    // credentials and the contract's own fields
    "Authorization", "Cookie", "Set-Cookie", "Idempotency-Key", "Idempotent-Replayed",
    "Idempotent-Body-Omitted", "Idempotency-Status"};

std::string reserved_text() {
  std::string out = "not a field the gateway or the contract uses itself:";
  for (std::string_view name : kNotRequestIdFields) out += " `" + std::string(name) + "`";
  return out + " (compared case-insensitively)";
}

}  // namespace

const KeyTable<Config>& top_keys() {
  static const KeyTable<Config> table = {
      custom_key<Config>("listen", "mapping", "— (**required**)", "", "", "the client listener"),
      custom_key<Config>("admin", "mapping", "`127.0.0.1:9090`", "", "C30, C31",
                         "`/healthz`, `/readyz`, `/metrics`"),
      custom_key<Config>("threads", "integer", "0 → `std::thread::hardware_concurrency()`",
                         "0 – 256", "", "io_context threads, at least 1"),
      custom_key<Config>("limits", "mapping", "see below", "", "C04, C07, C52", ""),
      custom_key<Config>("request_id", "mapping", "`{ header: X-Request-Id, generate: true }`", "",
                         "C32", "request ids on the wire and in the access line"),
      custom_key<Config>("storage", "mapping", "— (**required**)", "", "C15, C23–C25", ""),
      custom_key<Config>("upstreams", "mapping name → upstream", "— (**required**)", "at least one",
                         "C05, C06, C08", ""),
      custom_key<Config>("routes", "list", "— (**required**)", "at least one", "C01, C10–C12", ""),
  };
  return table;
}

namespace {

KeyTable<Listen> listener_keys(const Listen& defaults, bool is_admin) {
  KeyTable<Listen> table = {
      custom_key<Listen>("address", "IP literal", "`" + defaults.address + "`",
                         "IPv4 or IPv6; host names are rejected", "",
                         "`\"::\"`, `\"0.0.0.0\"` for all interfaces; `[::1]`-style brackets are "
                         "accepted and removed"),
      custom_key<Listen>(
          "port", "port", is_admin ? "`" + std::to_string(defaults.port) + "`" : "— (**required**)",
          "0 – 65535; 0 = the OS chooses", is_admin ? "" : "",
          is_admin ? "must differ from `listen.port` when both are non-zero and the addresses "
                     "overlap (equal, or either is `0.0.0.0`/`::`)"
                   : "required so that the gateway never takes a port nobody wrote down"),
  };
  if (!is_admin) {
    table.push_back(custom_key<Listen>("tls.cert", "file (PEM)", "none",
                                       "required when `tls` is present", "",
                                       "the certificate chain, leaf first"));
    table.push_back(custom_key<Listen>("tls.key", "file (PEM)", "none",
                                       "required when `tls` is present", "",
                                       "`cert` and `key` go together (both or neither)"));
    table.push_back(custom_key<Listen>(
        "tls.alpn", "list of `h2`, `http/1.1`", "`[h2, http/1.1]`", "not empty, no repeats", "C49",
        "protocols offered by ALPN, preferred first; a client that offers none of them (or no "
        "ALPN) speaks HTTP/1.1"));
    table.push_back(boolean_key("h2c", &Listen::h2c, defaults, "C49",
                                "a cleartext connection that starts with the HTTP/2 client "
                                "preface is served as HTTP/2 (prior knowledge); `Upgrade: h2c` "
                                "is never honoured"));
  }
  return table;
}

}  // namespace

const KeyTable<Listen>& listen_keys() {
  static const KeyTable<Listen> table = listener_keys(Listen{}, false);
  return table;
}

const KeyTable<Listen>& admin_keys() {
  static const KeyTable<Listen> table = listener_keys(Config{}.admin, true);
  return table;
}

const KeyTable<Limits>& limits_keys() {
  static const Limits d;
  static const KeyTable<Limits> table = {
      size_key("max_request_body", &Limits::max_request_body, d, 0, GiB, "C04",
               "a larger held body → 413 (a keyed body is buffered to fingerprint it)"),
      size_key("max_header_bytes", &Limits::max_header_bytes, d, KiB, MiB, "C04",
               "a larger header section → 431"),
      duration_key("header_read_timeout", &Limits::header_read_timeout, d, 10ms, 10min, "C07",
                   "the whole header section must arrive within it"),
      duration_key("idle_timeout", &Limits::idle_timeout, d, 10ms, 24h, "C07",
                   "idle keep-alive client connections close"),
      duration_key("drain_timeout", &Limits::drain_timeout, d, 0ms, 10min, "SPEC §1",
                   "SIGTERM waits this long for in-flight requests; 0 = do not wait"),
      size_key("stream_buffer", &Limits::stream_buffer, d, KiB, 16 * MiB, "C38",
               "bytes held per direction of a streamed exchange or tunnel"),
      {{"max_streamed_body", "size", "none (no limit)", "1B – 1024GiB", "C38",
        "a streamed body with a larger Content-Length → 413 before anything is forwarded; a "
        "chunked one that passes it → 413 if no response has started (else the exchange is "
        "cut), both connections closed"},
       [](Loader& l, const Field& f, Limits& s) {
         s.max_streamed_body = static_cast<std::size_t>(l.size(f, 1, 1024 * GiB));
       }},
      duration_key("tunnel_idle_timeout", &Limits::tunnel_idle_timeout, d, 10ms, 24h, "C40",
                   "a tunnel in which no byte moved either way for this long is closed"),
      {{"max_connections", "integer", "from `RLIMIT_NOFILE` (see below)", "1 – 1000000", "C52",
        "client connections open at once; at the limit the gateway stops accepting (new "
        "connections wait in the listen backlog) until one closes; read at start"},
       [](Loader& l, const Field& f, Limits& s) {
         s.max_connections = static_cast<std::size_t>(l.integer(f, 1, 1'000'000));
       }},
      integer_key("max_tunnels", &Limits::max_tunnels, d, 0, 1'000'000, "C52",
                  "tunnels open at once; an upgrade past it → 503 `overloaded` with "
                  "`Retry-After`, nothing forwarded; 0 = no upgrades"),
      integer_key("h2_max_concurrent_streams", &Limits::h2_max_concurrent_streams, d, 1, 10'000,
                  "C50",
                  "streams an HTTP/2 client may have open at once on one connection "
                  "(advertised in SETTINGS); more are refused with `REFUSED_STREAM`, never "
                  "queued"),
  };
  return table;
}

const KeyTable<RequestId>& request_id_keys() {
  static const RequestId d;
  static const KeyTable<RequestId> table = {
      custom_key<RequestId>("header", "header name", "`" + d.header + "`", reserved_text(), "C32",
                            "the field that carries the id, both ways"),
      boolean_key("generate", &RequestId::generate, d, "C32",
                  "`true`: a request without a valid id gets a generated one; `false`: the "
                  "gateway never writes the request's field"),
  };
  return table;
}

void read_listen(Loader& loader, const Field& f, Listen& out, bool is_admin) {
  const auto& table = is_admin ? admin_keys() : listen_keys();
  const Map m(loader, f, names_of(table));
  if (auto a = m.get("address")) out.address = loader.ip_address(*a);
  // The public listener's port is required: a gateway that silently takes 8080 surprises.
  if (is_admin) {
    if (auto p = m.get("port")) out.port = loader.port(*p, true);
  } else {
    out.port = loader.port(m.require("port"), true);
  }
  if (!is_admin) {
    if (auto h2c = m.get("h2c")) out.h2c = loader.boolean(*h2c);
  }
  if (auto t = m.get("tls")) {
    const Map tls(loader, *t, names_of(table, "tls"));
    const Field cert = tls.require("cert");
    const Field key = tls.require("key");
    out.tls_cert = loader.pem_file(cert, Loader::Pem::certificate);
    out.tls_key = loader.pem_file(key, Loader::Pem::private_key);
    if (auto alpn = tls.get("alpn")) {
      out.tls_alpn.clear();
      const auto items = loader.sequence(*alpn);
      if (items.empty()) loader.fail(*alpn, "must not be empty");
      for (const Field& item : items) {
        auto protocol = loader.choice<std::string>(item, {{"h2", "h2"}, {"http/1.1", "http/1.1"}});
        if (std::find(out.tls_alpn.begin(), out.tls_alpn.end(), protocol) != out.tls_alpn.end()) {
          loader.fail(item, "duplicate protocol " + in_quotes(protocol));
        }
        out.tls_alpn.push_back(std::move(protocol));
      }
    }
  }
}

void read_limits(Loader& loader, const Field& f, Limits& out) {
  const Map m(loader, f, names_of(limits_keys()));
  read_keys(loader, m, limits_keys(), out);
}

void read_request_id(Loader& loader, const Field& f, RequestId& out) {
  const Map m(loader, f, names_of(request_id_keys()));
  if (auto v = m.get("header")) {
    out.header = loader.non_empty(*v);
    if (!is_token(out.header)) {
      loader.fail(*v, in_quotes(out.header) + " is not a valid header name");
    }
    for (std::string_view reserved : kNotRequestIdFields) {
      if (iequals(out.header, reserved)) {
        loader.fail(*v, in_quotes(out.header) +
                            " is a field the gateway or the idempotency contract already uses; "
                            "choose another name, e.g. X-Request-Id");
      }
    }
  }
  read_keys(loader, m, request_id_keys(), out);
}

}  // namespace idemgate::config::detail
