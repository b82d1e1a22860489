// Fuzz target for request framing and header processing (SPEC §3, C02, C03, C04; §4). The input
// is what a client sends on one connection. It is parsed as the session parses it (Beast's
// request_parser with the gateway's header and body limits, requests one after another on the
// same bytes); every request that parses goes through what the session and the idempotency
// handler do to it before any I/O: the Transfer-Encoding rule, route matching, hop-by-hop
// stripping, forwarding fields, key parsing, scope, record id and fingerprint.

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/check.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/config/config_loader.hpp"
#include "gateway/core/fingerprint.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/request_id.hpp"
#include "gateway/http/request_rules.hpp"
#include "gateway/http/router.hpp"
#include "gateway/http/traceparent.hpp"
#include "gateway/request_identity.hpp"

namespace bhttp = boost::beast::http;
namespace config = idemgate::config;
namespace core = idemgate::core;
namespace http = idemgate::http;
using idemgate::fuzz::check;

namespace {

// Routes of every match kind and every key source; small limits so that the fuzzer reaches
// them (431 and 413 paths) with short inputs.
constexpr const char* kConfig = R"(
listen: { port: 0 }
limits: { max_request_body: 4KiB, max_header_bytes: 2KiB }
storage:
  postgres: { dsn: "postgresql://idem@127.0.0.1:5432/idem" }
upstreams:
  app: { servers: ["127.0.0.1:9001"] }
routes:
  - name: exact
    match: { path: /payments/exact, host: api.example.com, methods: [POST, PUT] }
    upstream: app
    idempotency:
      mode: required
      methods: [POST, PUT]
      key_scope: { headers: [Authorization, X-Tenant] }
      fingerprint: { headers: [Content-Type, Content-Encoding, X-Amount] }
  - name: saga
    match: { path_prefix: /saga, host: "*.example.com" }
    upstream: app
    idempotency:
      mode: required
      key_source: { headers: [X-Saga-Id, X-Saga-Step] }
  - name: events
    match: { path_prefix: /events, methods: [POST] }
    upstream: app
    idempotency:
      mode: optional
      key_source: { json_pointer: /data/event~1id/0 }
      fingerprint_body: json
  - name: custom
    match: { path_prefix: /custom }
    upstream: app
    idempotency:
      mode: optional
      key_source: { header: X-Request-Key }
  - name: rest
    match: { path_prefix: / }
    upstream: app
)";

const config::Config& gateway_config() {
  static const auto loaded = config::load_config_from_string(kConfig, "request_framing.yaml");
  return *loaded;
}

// The hop-by-hop fields of SPEC C02 that never reach the other side.
constexpr std::string_view kHopByHop[] = {
    "Connection",          "Keep-Alive",         "Proxy-Connection", "TE", "Trailer", "Upgrade",
    "Proxy-Authorization", "Proxy-Authenticate", "Transfer-Encoding"};

void check_canonical_json(std::string_view body) {
  const auto canonical = core::canonical_json(body);
  if (!canonical) return;
  const auto again = core::canonical_json(*canonical);
  check(again && *again == *canonical, "canonical JSON is a fixed point");
}

/// What the session does with a request that parsed, up to the handler (session.cpp serve_one).
void process(bhttp::request<bhttp::string_body> req, const config::Config& cfg) {
  // Framing, Host and absolute-form (C03): a rejection is a 400 and the connection closes.
  if (const auto rejection = http::check_request_head(req.base(), req.chunked())) {
    check(!rejection->detail.empty(), "a rejection says why");
    return;
  }
  check(req.count(bhttp::field::transfer_encoding) == 0 || req.chunked(),
        "a Transfer-Encoding that passes ends with chunked");
  check(req.target().empty() || req.target().front() == '/' || req.target() == "*",
        "a target that passes is origin-form or *");

  // The request's ids (session.cpp take_ids): with the default request_id section every request
  // ends up with exactly one valid id in its field; a trace id is 32 lower-case hex digits.
  std::string id_storage;
  const std::string id(http::apply_request_id(req.base(), cfg.request_id, id_storage));
  check(http::valid_request_id(id), "the request id is valid");
  check(req.count(cfg.request_id.header) == 1 && req[cfg.request_id.header] == id,
        "the request field holds the request id");
  const std::string_view trace_id = http::request_trace_id(req.base());
  check(trace_id.empty() || (trace_id.size() == http::kTraceIdBytes &&
                             trace_id.find_first_not_of("0123456789abcdef") == trace_id.npos &&
                             trace_id != std::string(http::kTraceIdBytes, '0')),
        "a trace id is 32 lower-case hex digits, not all zero");

  const std::string method(req.method_string());
  const std::string target(req.target());
  const std::string_view path = http::target_path(target);
  const std::string host(req[bhttp::field::host]);
  const config::Route* route = http::match(cfg, host, path, method);
  // The catch-all `path_prefix: /` matches every origin-form path; `*` and authority-form do
  // not start with '/' and get 404.
  check((route != nullptr) == path.starts_with('/'), "the catch-all route matches every path");
  if (route == nullptr) return;
  // Routes see the normalized path (router.hpp), which normalizing again leaves as it is.
  std::string scratch;
  std::string again;
  const std::string_view normal = http::normalized_path(path, scratch);
  check(normal.starts_with('/') && http::normalized_path(normal, again) == normal,
        "a normalized path starts with '/' and is its own normal form");
  if (!route->match.path.empty()) check(normal == route->match.path, "exact path matched");
  check(normal.starts_with(route->match.path_prefix), "path prefix matched");
  if (!route->match.methods.empty()) {
    check(std::find(route->match.methods.begin(), route->match.methods.end(), method) !=
              route->match.methods.end(),
          "method matched");
  }
  std::string_view name = idemgate::common::authority_host(host);
  check(name.size() <= host.size(), "a host name is part of the Host value");
  // The FQDN form "a.example.com." names the same host as "a.example.com" (the router's rule).
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  const std::string_view want = route->match.host;
  if (want.starts_with("*.")) {
    const std::string_view suffix = want.substr(1);
    check(name.size() > suffix.size() &&
              boost::beast::iequals(name.substr(name.size() - suffix.size()), suffix),
          "wildcard host matched a subdomain");
  } else if (!want.empty()) {
    check(boost::beast::iequals(name, want), "host matched");
  }

  (void)http::keep_alive_timeout(req.base());
  (void)http::has_token(req.base(), "Connection", "close");
  std::vector<std::string> named;
  for (const auto& field : req.base()) {
    if (field.name() != bhttp::field::connection) continue;
    for (const auto& token : bhttp::token_list(field.value())) named.emplace_back(token);
  }
  const auto hosts = req.count(bhttp::field::host);
  const bool framed = req.has_content_length() || req.chunked();

  http::strip_hop_by_hop(req.base());
  for (const auto field : kHopByHop) check(req.count(field) == 0, "hop-by-hop field stripped");
  for (const auto& n : named) {
    if (!boost::beast::iequals(n, "Host")) check(req.count(n) == 0, "Connection-named field gone");
  }
  check(req.count(bhttp::field::host) == hosts, "Host is never stripped");

  req.erase(bhttp::field::expect);
  req.erase("Idempotent-Replayed");
  http::add_forwarding_fields(req.base(), "192.0.2.7", "http");
  check(req["X-Forwarded-Proto"] == "http", "X-Forwarded-Proto set");
  check(req.count("X-Forwarded-For") == 1 && req["X-Forwarded-For"].ends_with("192.0.2.7"),
        "client address appended to X-Forwarded-For");
  check(req.count("Via") == 1 && req["Via"].ends_with(http::kViaEntry), "Via entry appended");
  if (framed || !req.body().empty()) req.content_length(req.body().size());

  const core::KeyParse key =
      idemgate::request_key(config::contract_of(*route).idempotency, req.base(), req.body());
  const core::Sha256 scope = idemgate::request_scope(*route, req);
  const auto fp_headers =
      idemgate::header_values(req, config::contract_of(*route).idempotency.fingerprint_headers);
  const auto fp_bytes =
      core::compute_fingerprint(method, target, fp_headers, req.body(), core::BodyMode::bytes);
  const auto fp_json =
      core::compute_fingerprint(method, target, fp_headers, req.body(), core::BodyMode::json);
  if (!core::canonical_json(req.body())) check(fp_bytes == fp_json, "non-JSON falls back to bytes");
  if (key.status == core::KeyParse::Status::valid) (void)core::record_id(scope, key.key);
  check_canonical_json(req.body());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const config::Config& cfg = gateway_config();
  const auto header_limit = static_cast<std::uint32_t>(std::min<std::size_t>(
      cfg.limits.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // Requests one after another, as on a keep-alive connection, until the input ends or a
  // request ends the connection (a parse error or a refused framing).
  while (!input.empty()) {
    // The session's probe: it decides when the whole header section is in (or already wrong).
    bhttp::request_parser<bhttp::empty_body> probe;
    probe.header_limit(header_limit);
    boost::system::error_code pec;
    probe.put(boost::asio::buffer(input.data(), input.size()), pec);
    if (pec == bhttp::error::need_more) return 0;  // the client stopped mid-header
    if (http::has_obs_fold(input)) return 0;       // 400: the connection ends

    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(header_limit);
    parser.body_limit(static_cast<std::uint64_t>(cfg.limits.max_request_body));
    parser.eager(true);
    // As beast::http::read does: after need_more the parser gets more bytes, never the same
    // ones again (Beast asserts on that in parse_chunk_header); here all bytes are in, so
    // need_more means the client closed.
    std::size_t used = 0;
    boost::system::error_code ec;
    for (;;) {
      const std::size_t n =
          parser.put(boost::asio::buffer(input.data() + used, input.size() - used), ec);
      used += n;
      if (ec == bhttp::error::need_more || (!ec && !parser.is_done() && n == 0)) {
        parser.put_eof(ec);
        break;
      }
      if (ec || parser.is_done()) break;
    }
    check(used <= input.size(), "the parser consumed no more than it was given");
    if (ec) {
      // 400/413/431 with a detail, or the connection ended (EOF mid-message): answered or not,
      // the connection ends.
      const auto rejection = http::rejection_for(ec, cfg.limits);
      check(!rejection || !rejection->detail.empty(), "a rejection says why");
      return 0;
    }
    if (!parser.is_done()) return 0;
    const bool keep_alive = parser.get().keep_alive();
    process(parser.release(), cfg);
    if (!keep_alive || used == 0) return 0;
    input.remove_prefix(used);
  }
  return 0;
}
