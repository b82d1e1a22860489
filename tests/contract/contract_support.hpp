#pragma once
// Helpers shared by the contract suites (tests/contract/*_e2e_test.cpp): raw requests for bytes
// the client library would not write, and the checks several suites repeat. Everything else
// (polling for store state with eventually() included) comes from tests/e2e/gateway_fixture.hpp.

#include <sys/socket.h>
#include <sys/time.h>
#include <algorithm>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json/parse.hpp>
#include <cctype>
#include <chrono>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"

namespace idemgate::test::contract {

using namespace idemgate::test::e2e;

/// True when the response carries `Idempotent-Replayed: true` (SPEC C16).
inline bool replayed(const HttpResponse& res) {
  return res.header("Idempotent-Replayed").value_or("") == "true";
}

/// True when `problem_type(res)` ends with `suffix` (e.g. "/request-in-flight").
inline bool problem_type_ends_with(const HttpResponse& res, const std::string& suffix) {
  const std::string type = problem_type(res);
  return type.size() >= suffix.size() &&
         type.compare(type.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The `detail` member of a problem body ("" when there is none).
inline std::string problem_detail(const HttpResponse& res) {
  boost::json::error_code ec;
  const boost::json::value body = boost::json::parse(res.body, ec);
  if (ec || !body.is_object()) return "";
  const auto* detail = body.as_object().if_contains("detail");
  return detail && detail->is_string() ? std::string(detail->as_string()) : "";
}

/// A route named `name` on `path_prefix` to `upstream` with `mode` and extra `idempotency`
/// lines.
inline RouteConfig route(std::string name, std::string path_prefix, std::string upstream,
                         std::string mode = "required", std::vector<std::string> extra = {}) {
  RouteConfig r;
  r.name = std::move(name);
  r.path_prefix = std::move(path_prefix);
  r.upstream = std::move(upstream);
  r.mode = std::move(mode);
  r.extra = std::move(extra);
  return r;
}

/// The gateway of the HTTP/2 suites (SPEC C49–C51): a keyed route `keyed` on /pay, a
/// pass-through route holding answers up to 1 KiB on /big, and pass-through for the rest, all
/// to `upstream`, with `limits` (a flow mapping).
inline GatewayConfig h2_gateway_config(const TestUpstream& upstream, const std::string& keyed,
                                       std::string limits) {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.routes = {route(keyed, "/pay", "up", "required"),
                   route("big", "/big", "up", "off", {"max_stored_response: 1KiB"}),
                   route("all", "/", "up", "off")};
  config.limits = std::move(limits);
  return config;
}

/// A request in raw bytes. `Host` and `Content-Length` are added unless a field of that name
/// (or Transfer-Encoding) is among `fields`.
inline std::string raw_request(const std::string& method, const std::string& target,
                               const std::vector<std::string>& fields, const std::string& body,
                               const std::string& eol = "\r\n") {
  std::string raw = method + " " + target + " HTTP/1.1" + eol;
  bool host = false;
  bool framing = false;
  for (const auto& f : fields) {
    std::string name = f.substr(0, f.find(':'));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    host = host || name == "host";
    framing = framing || name == "content-length" || name == "transfer-encoding";
    raw += f + eol;
  }
  if (!host) raw += "Host: gateway.test" + eol;
  if (!framing) raw += "Content-Length: " + std::to_string(body.size()) + eol;
  return raw + eol + body;
}

/// How many idempotency records route `route` has (route names are unique per run).
inline long long record_count(Database& db, const std::string& route) {
  return std::stoll(db.scalar("SELECT count(*) FROM idempotency_record WHERE route = $1", {route}));
}

/// Whether the record of `key` on `route` (no key_scope headers) exists.
inline bool record_exists(Database& db, const std::string& route, const std::string& key) {
  return db
      .row("SELECT 1 FROM idempotency_record WHERE id = decode($1, 'hex')",
           {record_id_hex(route, key)})
      .has_value();
}

/// A route name unique to this run, usable as a YAML plain scalar.
inline std::string unique_route(const std::string& prefix) {
  std::string name = unique_name(prefix);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

/// 64 lower-case hex digits (a hex HMAC-SHA-256, SPEC C14).
inline bool is_hex64(const std::string& s) {
  static const std::regex hex64("[0-9a-f]{64}");
  return std::regex_match(s, hex64);
}

/// What a raw exchange saw: every complete response, in order, and how the connection ended.
struct RawExchange {
  std::vector<HttpResponse> responses;
  std::string rest;     ///< received bytes that are not a complete response
  bool closed = false;  ///< the server closed the connection (EOF or reset) before the timeout
};

/// Connects to 127.0.0.1:`port`, writes `bytes` and reads until the server closes or `timeout`
/// passes without a byte. Unlike HttpConnection it keeps reading after a response, so it shows
/// a second response (a request smuggled through) and whether the server closed.
inline RawExchange raw_exchange(std::uint16_t port, const std::string& bytes,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  namespace asio = boost::asio;
  namespace bhttp = boost::beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::address_v4::loopback(), port});
  const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                   static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  boost::system::error_code ec;
  asio::write(socket, asio::buffer(bytes), ec);  // a server that closed early may reset this

  RawExchange out;
  std::string data;
  char chunk[4096];
  for (;;) {
    const std::size_t n = socket.read_some(asio::buffer(chunk), ec);
    data.append(chunk, n);
    if (ec == asio::error::eof || ec == asio::error::connection_reset) out.closed = true;
    if (ec) break;
  }

  std::size_t offset = 0;
  while (offset < data.size()) {
    const std::size_t start = offset;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.eager(true);
    parser.body_limit(boost::none);
    boost::beast::error_code pec;
    for (;;) {
      const std::size_t used =
          parser.put(asio::buffer(data.data() + offset, data.size() - offset), pec);
      offset += used;
      if (parser.is_done()) break;
      if (pec == bhttp::error::need_more && used > 0) continue;
      if (pec == bhttp::error::need_more && out.closed) parser.put_eof(pec);
      break;
    }
    if (!parser.is_done()) {
      out.rest = data.substr(start);
      break;
    }
    const auto& message = parser.get();
    HttpResponse res;
    res.status = message.result_int();
    res.version = message.version();
    for (const auto& f : message) res.headers.emplace_back(f.name_string(), f.value());
    res.body = message.body();
    res.keep_alive = message.keep_alive();
    out.responses.push_back(std::move(res));
  }
  return out;
}

}  // namespace idemgate::test::contract
