#pragma once
// What the proxy reads from the configuration (SPEC §2): listeners, client limits, upstreams,
// request ids and routes. Plain values that the loader (gateway/config) has validated: every field
// here already holds a value that is in range. The proxy knows nothing of idempotency keys; what
// the layer above keeps per route (the contract, CORS) rides in Route::handler_config, opaque
// here as Envoy's per-route filter configuration is opaque to its router.

#include <any>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gateway/common/host_port.hpp"

namespace idemgate::http {

using Duration = std::chrono::milliseconds;

/// A listening address; `port` 0 lets the OS choose.
struct Listen {
  std::string address = "127.0.0.1";
  std::uint16_t port = 8080;
  /// TLS files (PEM); both empty means plain HTTP.
  std::string tls_cert;
  std::string tls_key;
  /// The protocols offered by ALPN on a TLS listener, in the gateway's order of preference
  /// (SPEC C49): "h2" and/or "http/1.1". A client that offers none of them, or no ALPN at all,
  /// speaks HTTP/1.1.
  std::vector<std::string> tls_alpn = {"h2", "http/1.1"};
  /// HTTP/2 with prior knowledge on a cleartext listener (SPEC C49): a connection that starts
  /// with the client preface is served as HTTP/2, any other as HTTP/1.1.
  bool h2c = true;
};

/// `limits:` — client-side limits (SPEC C04, C07).
struct Limits {
  std::size_t max_request_body = 1024 * 1024;  ///< bytes; larger → 413
  std::size_t max_header_bytes = 8 * 1024;     ///< bytes of the header section; larger → 431
  Duration header_read_timeout = std::chrono::seconds(10);
  Duration idle_timeout = std::chrono::seconds(60);
  Duration drain_timeout = std::chrono::seconds(30);
  /// Bytes held per direction of a streamed exchange (SPEC C38): one read or write at a time.
  std::size_t stream_buffer = 64 * 1024;
  /// Largest streamed request body (SPEC C38); 0: no limit. A Content-Length above it → 413, a
  /// chunked body that passes it is cut.
  std::size_t max_streamed_body = 0;
  /// A tunnel (SPEC C40) in which no byte moved either way for this long is closed.
  Duration tunnel_idle_timeout = std::chrono::minutes(5);
  /// Streams an HTTP/2 client may have open at once on one connection (SPEC C50); more are
  /// refused with REFUSED_STREAM.
  std::size_t h2_max_concurrent_streams = 100;
  /// Client connections open at once, over all io threads (SPEC C52); at the limit the gateway
  /// stops accepting until one closes. 0: derived at start from RLIMIT_NOFILE
  /// (gateway/descriptor_budget.hpp). Read at start only, like the listener.
  std::size_t max_connections = 0;
  /// Tunnels open at once, over all io threads (SPEC C52); an upgrade past it → 503.
  std::size_t max_tunnels = 10000;
};

struct Upstream {
  std::string name;
  std::vector<common::HostPort>
      servers;  ///< round robin; a server that refuses a connection is skipped
  Duration connect_timeout = std::chrono::seconds(1);
  Duration request_timeout = std::chrono::seconds(20);
  int max_idle_connections = 64;  ///< per io thread
  Duration idle_timeout = std::chrono::seconds(4);
  std::size_t max_response_body = 64 * 1024 * 1024;  ///< bytes
  /// `tls: true`: connections to the servers are TLS 1.2+, the server certificate is verified
  /// against `tls_ca_file` (PEM; empty: the system's trust store) and must name
  /// `tls_server_name` (empty: each server's host, IP literals included). SNI carries that name
  /// unless it is an IP address.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_server_name;
};

/// `request_id:` — the request id field (conf/REFERENCE.md, "request_id"). A received id that
/// is valid (1–200 bytes of visible ASCII, one field) is forwarded unchanged, returned on the
/// response and logged; otherwise, with `generate`, a fresh UUID v4 replaces it.
struct RequestId {
  std::string header = "X-Request-Id";  ///< an RFC 9110 token; not a field the gateway manages
  /// true: a request without a valid id gets a generated one (forwarded, returned, logged);
  /// false: the request field is never written; only a valid received id is returned and logged.
  bool generate = true;
};

struct Match {
  std::string path_prefix;           ///< empty: not used
  std::string path;                  ///< exact path; empty: not used
  std::string host;                  ///< empty: any; `*.example.com` matches subdomains
  std::vector<std::string> methods;  ///< empty: any
};

/// `routes[]` as the proxy uses it: where a request goes (SPEC C01), upgrades (C40) and the
/// in-flight bound (C53).
struct Route {
  std::string name;
  Match match;
  std::string upstream;  ///< a key of ProxyConfig::upstreams (checked by the loader)
  /// Protocols a client may upgrade to on this route (SPEC C40): only "websocket" exists.
  std::vector<std::string> upgrade;
  /// Requests of this route in progress at once, over all io threads (SPEC C53); past it → 503
  /// with Retry-After before the handler sees the request. 0: no bound.
  std::size_t max_in_flight = 0;
  /// What the request handler keeps for this route (the idempotency contract and CORS: the
  /// loader stores a config::RouteContract); empty for a route built without one.
  std::any handler_config;
};

/// The part of the configuration the proxy runs on; a reload swaps it whole
/// (`std::shared_ptr<const ProxyConfig>`, shared between threads).
struct ProxyConfig {
  Listen listen;
  int threads = 0;  ///< 0 → hardware cores, resolved by the loader to ≥ 1
  Limits limits;
  RequestId request_id;
  std::map<std::string, Upstream> upstreams;
  std::vector<Route> routes;  ///< in file order
};

}  // namespace idemgate::http
