// stream-upstream: an HTTP/1.1 upstream for the streaming and upgrade cases (SPEC C38, C40).
// Bodies are generated and checked piece by piece, never held, so that a test can move a GiB
// through the gateway and know, from the upstream's side, how much was written or read and
// whether the bytes arrived intact. Byte i of every body is i % 251 (a prime, so a lost, doubled
// or reordered 64 KiB piece breaks the pattern).
//
//   GET  /bytes?n=N[&chunked=1][&rate=BYTES_PER_SEC]   N bytes (Content-Length, or chunked),
//                                                      written in pieces of up to 64 KiB
//   POST /sink[?rate=BYTES_PER_SEC]                    reads the body as it comes; answers
//                                                      {"bytes":N,"pattern_ok":bool}
//   GET  /die?n=N&total=T[&chunked=1]                  announces T bytes, writes N, closes
//   POST /early?after=N&status=S&then=stall|reset|drain
//                                                      reads N body bytes, answers S (with
//                                                      `Connection: close`), then stops reading
//                                                      (and closes after a minute), resets the
//                                                      connection, or reads the rest and closes
//   POST /duplex                                       a chunked 200 at once, then one chunk
//                                                      "<bytes so far>\n" per piece of the
//                                                      (Content-Length) body as it is read
//   GET  /sse[?head=0]                                 a server-sent-events stream: the header and
//                                                      one event (none with head=0), then nothing
//                                                      until the peer closes
//   GET  /bad-upgrade?upgrade=P                        101 with `Upgrade: P` (none when empty)
//   GET  /ws                                           WebSocket echo (426 without an upgrade)
//   GET  /headers                                      the request's fields as JSON
//   GET  /stats                                        counters as JSON
//   any request with `Upgrade: h2c`                    101 + `Upgrade: h2c`, then close
//
// Usage: stream-upstream [--listen 127.0.0.1:0]. Logs one JSON object a line on stderr, the
// first being {"msg":"listening","address":…,"port":N}. SIGTERM/SIGINT stop it.

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <boost/beast/websocket/stream.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/common/use_nothrow.hpp"
#include "tests/support/pattern_body.hpp"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

using idemgate::common::use_nothrow;
constexpr std::size_t kPiece = 64 * 1024;

/// Everything runs on one thread: plain counters.
struct Stats {
  std::uint64_t connections = 0;
  std::uint64_t requests = 0;
  std::uint64_t bytes_written_total = 0;  ///< body bytes of /bytes and /die handed to the kernel
  std::uint64_t bytes_responses_done = 0;
  std::uint64_t bytes_responses_failed = 0;  ///< /bytes writes that failed (peer gone)
  std::uint64_t sink_requests = 0;           ///< /sink request headers received
  std::uint64_t sink_bytes_total = 0;
  std::uint64_t sink_done = 0;        ///< /sink bodies read to their end and answered
  std::uint64_t sink_incomplete = 0;  ///< /sink bodies that ended early (peer gone)
  std::uint64_t died = 0;
  std::uint64_t ws_sessions = 0;
  std::uint64_t ws_open = 0;
  std::uint64_t ws_messages = 0;
  std::uint64_t h2c_upgrades = 0;
  std::uint64_t headers_requests = 0;
  std::uint64_t early_requests = 0;  ///< /early request headers received
  std::uint64_t early_answers = 0;   ///< /early answers written
  std::uint64_t early_drained = 0;   ///< /early bodies read to their end after the answer
  std::uint64_t duplex_done = 0;     ///< /duplex bodies read to their end and answered
  std::uint64_t sse_open = 0;        ///< /sse streams whose peer has not closed yet
  std::uint64_t sse_closed = 0;      ///< /sse streams whose peer closed or reset
  std::uint64_t bad_upgrades = 0;
};
Stats stats;

void log_line(std::string_view msg, json::object fields = {}) {
  json::object line;
  line["msg"] = msg;
  for (auto& [k, v] : fields) line[k] = v;
  std::cerr << json::serialize(line) << std::endl;
}

using idemgate::test::fill_pattern;
using idemgate::test::pattern_matches;

std::map<std::string, std::string, std::less<>> query_of(std::string_view target) {
  std::map<std::string, std::string, std::less<>> out;
  const auto q = target.find('?');
  if (q == std::string_view::npos) return out;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const auto eq = pair.find('=');
    out[std::string(pair.substr(0, eq))] =
        eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return out;
}

std::uint64_t number(const std::map<std::string, std::string, std::less<>>& query,
                     std::string_view name, std::uint64_t fallback = 0) {
  const auto it = query.find(name);
  if (it == query.end() || it->second.empty()) return fallback;
  return std::stoull(it->second);
}

std::string hex(std::size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}

json::object stats_json() {
  return {{"connections", stats.connections},
          {"requests", stats.requests},
          {"bytes_written_total", stats.bytes_written_total},
          {"bytes_responses_done", stats.bytes_responses_done},
          {"bytes_responses_failed", stats.bytes_responses_failed},
          {"sink_requests", stats.sink_requests},
          {"sink_bytes_total", stats.sink_bytes_total},
          {"sink_done", stats.sink_done},
          {"sink_incomplete", stats.sink_incomplete},
          {"died", stats.died},
          {"ws_sessions", stats.ws_sessions},
          {"ws_open", stats.ws_open},
          {"ws_messages", stats.ws_messages},
          {"h2c_upgrades", stats.h2c_upgrades},
          {"headers_requests", stats.headers_requests},
          {"early_requests", stats.early_requests},
          {"early_answers", stats.early_answers},
          {"early_drained", stats.early_drained},
          {"duplex_done", stats.duplex_done},
          {"sse_open", stats.sse_open},
          {"sse_closed", stats.sse_closed},
          {"bad_upgrades", stats.bad_upgrades}};
}

/// Sleeps until `sent` bytes at `rate` bytes/s from `start` are due.
asio::awaitable<void> pace(std::uint64_t rate, Clock::time_point start, std::uint64_t sent) {
  if (rate == 0) co_return;
  const auto due = start + std::chrono::microseconds(sent * 1'000'000 / rate);
  if (due <= Clock::now()) co_return;
  asio::steady_timer timer(co_await asio::this_coro::executor, due);
  co_await timer.async_wait(use_nothrow);
}

asio::awaitable<bool> write_text(beast::tcp_stream& stream, const std::string& text) {
  auto [ec, n] = co_await asio::async_write(stream, asio::buffer(text), use_nothrow);
  co_return !ec;
}

asio::awaitable<bool> write_response(beast::tcp_stream& stream, unsigned status,
                                     std::string_view reason, const std::string& content_type,
                                     const std::string& body, bool keep_alive) {
  std::string raw = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  raw += "Content-Type: " + content_type + "\r\n";
  raw += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (!keep_alive) raw += "Connection: close\r\n";
  raw += "\r\n" + body;
  co_return co_await write_text(stream, raw);
}

/// Writes `n` pattern bytes (`total` announced) as Content-Length or chunked body; false when
/// a write failed. `n < total` leaves the body incomplete on purpose (/die).
asio::awaitable<bool> write_pattern_body(beast::tcp_stream& stream, std::uint64_t n,
                                         std::uint64_t total, bool chunked, std::uint64_t rate,
                                         bool keep_alive) {
  std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n";
  head += chunked ? "Transfer-Encoding: chunked\r\n"
                  : "Content-Length: " + std::to_string(total) + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  head += "\r\n";
  if (!co_await write_text(stream, head)) co_return false;
  // Paced bodies go in pieces of about 1/20 s so that the rate is smooth.
  const std::size_t piece_size =
      rate == 0 ? kPiece
                : static_cast<std::size_t>(std::clamp<std::uint64_t>(rate / 20, 1, kPiece));
  std::vector<char> piece(piece_size);
  const auto start = Clock::now();
  std::uint64_t sent = 0;
  while (sent < n) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(piece_size, n - sent));
    fill_pattern(piece.data(), len, sent);
    boost::system::error_code ec;
    if (chunked) {
      const std::string size_line = hex(len) + "\r\n";
      const std::array<asio::const_buffer, 3> parts{
          asio::buffer(size_line), asio::buffer(piece.data(), len), asio::buffer("\r\n", 2)};
      auto [wec, wn] = co_await asio::async_write(stream, parts, use_nothrow);
      ec = wec;
    } else {
      auto [wec, wn] =
          co_await asio::async_write(stream, asio::buffer(piece.data(), len), use_nothrow);
      ec = wec;
    }
    if (ec) {
      log_line("body write failed", {{"written", sent}, {"error", ec.message()}});
      co_return false;
    }
    sent += len;
    stats.bytes_written_total += len;
    co_await pace(rate, start, sent);
  }
  if (chunked && n == total) co_return co_await write_text(stream, "0\r\n\r\n");
  co_return true;
}

struct BodyResult {
  std::uint64_t bytes = 0;
  bool pattern_ok = true;
  boost::system::error_code error;
};

/// Reads the rest of the request body through a 64 KiB piece, checking the pattern.
asio::awaitable<BodyResult> read_body(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                      bhttp::request_parser<bhttp::buffer_body>& parser,
                                      std::uint64_t rate) {
  BodyResult result;
  std::vector<char> piece(kPiece);
  const auto start = Clock::now();
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    auto [ec, n] = co_await bhttp::async_read(stream, buffer, parser, use_nothrow);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) {
      result.error = ec;
      co_return result;
    }
    const std::size_t got = piece.size() - parser.get().body().size;
    if (result.pattern_ok && !pattern_matches(piece.data(), got, result.bytes))
      result.pattern_ok = false;
    result.bytes += got;
    co_await pace(rate, start, result.bytes);
  }
  co_return result;
}

/// Makes `buffer` hold at least `n` bytes, reading more from the socket.
asio::awaitable<boost::system::error_code> fill(beast::tcp_stream& stream,
                                                beast::flat_buffer& buffer, std::size_t n) {
  while (buffer.size() < n) {
    auto [ec, got] = co_await stream.async_read_some(buffer.prepare(kPiece), use_nothrow);
    if (ec) co_return ec;
    buffer.commit(got);
  }
  co_return boost::system::error_code{};
}

/// Reads `n` body bytes (leftovers in `buffer` first) and checks them against the pattern.
asio::awaitable<boost::system::error_code> take(beast::tcp_stream& stream,
                                                beast::flat_buffer& buffer, std::uint64_t n,
                                                BodyResult& result, std::uint64_t rate,
                                                Clock::time_point start,
                                                std::uint64_t& counted = stats.sink_bytes_total) {
  while (n > 0) {
    if (buffer.size() == 0) {
      if (auto ec = co_await fill(stream, buffer, 1)) co_return ec;
    }
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), n));
    const auto* data = static_cast<const char*>(buffer.data().data());
    if (result.pattern_ok && !pattern_matches(data, len, result.bytes)) result.pattern_ok = false;
    buffer.consume(len);
    result.bytes += len;
    counted += len;
    n -= len;
    co_await pace(rate, start, result.bytes);
  }
  co_return boost::system::error_code{};
}

/// The /sink body read off the socket without Beast's body parser, which costs milliseconds a
/// piece in the unoptimised sanitizer build: Content-Length, or chunked (extensions and
/// trailers skipped).
asio::awaitable<BodyResult> read_sink_body(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                           const bhttp::request_parser<bhttp::buffer_body>& parser,
                                           std::uint64_t rate) {
  BodyResult result;
  const auto start = Clock::now();
  if (!parser.chunked()) {
    result.error =
        co_await take(stream, buffer, parser.content_length().value_or(0), result, rate, start);
    co_return result;
  }
  const auto line = [&]() -> std::string_view {
    const std::string_view data(static_cast<const char*>(buffer.data().data()), buffer.size());
    const auto eol = data.find("\r\n");
    return eol == std::string_view::npos ? std::string_view() : data.substr(0, eol + 2);
  };
  for (;;) {
    while (line().empty()) {
      if (buffer.size() > 4096) {
        result.error = bhttp::error::bad_chunk;
        co_return result;
      }
      if (auto ec = co_await fill(stream, buffer, buffer.size() + 1)) {
        result.error = ec;
        co_return result;
      }
    }
    const std::string size_line(line());
    buffer.consume(size_line.size());
    const std::uint64_t size = std::stoull(size_line, nullptr, 16);
    if (size == 0) break;
    if (auto ec = co_await take(stream, buffer, size, result, rate, start)) {
      result.error = ec;
      co_return result;
    }
    if (auto ec = co_await fill(stream, buffer, 2)) {
      result.error = ec;
      co_return result;
    }
    buffer.consume(2);
  }
  // Trailer fields, up to the empty line.
  for (;;) {
    while (line().empty()) {
      if (auto ec = co_await fill(stream, buffer, buffer.size() + 1)) {
        result.error = ec;
        co_return result;
      }
    }
    const std::size_t length = line().size();
    buffer.consume(length);
    if (length == 2) break;
  }
  co_return result;
}

/// /early: an answer before the whole request body was read (SPEC C47), as upstreams refusing
/// an upload do. Returns false: the connection is done with.
asio::awaitable<bool> early_answer(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                   const bhttp::request_parser<bhttp::buffer_body>& parser,
                                   const std::map<std::string, std::string, std::less<>>& query) {
  ++stats.early_requests;
  const std::uint64_t length = parser.content_length().value_or(0);
  const std::uint64_t after = std::min(number(query, "after"), length);
  std::uint64_t ignored = 0;
  BodyResult body;
  if (co_await take(stream, buffer, after, body, 0, Clock::now(), ignored)) co_return false;
  const auto status = static_cast<unsigned>(number(query, "status", 413));
  const auto it = query.find("then");
  const std::string then = it == query.end() ? "stall" : it->second;
  if (!co_await write_response(stream, status, "Early", "text/plain", "early answer\n", false))
    co_return false;
  ++stats.early_answers;
  log_line("early answer", {{"after", body.bytes}, {"then", then}});
  boost::system::error_code ec;
  if (then == "reset") {
    stream.socket().set_option(tcp::socket::linger(true, 0), ec);
    stream.socket().close(ec);
  } else if (then == "drain") {
    if (!co_await take(stream, buffer, length - after, body, 0, Clock::now(), ignored))
      ++stats.early_drained;
    stream.socket().close(ec);
  } else {
    // Reads nothing more; the gateway is the one to close.
    asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::minutes(1));
    co_await timer.async_wait(use_nothrow);
  }
  co_return false;
}

/// /duplex: a response that streams while the upload goes on (SPEC C47): the header at once,
/// then a chunk per piece of the body read.
asio::awaitable<bool> duplex(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                             const bhttp::request_parser<bhttp::buffer_body>& parser,
                             bool keep_alive) {
  std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  if (!co_await write_text(stream, head + "\r\n")) co_return false;
  std::uint64_t left = parser.content_length().value_or(0);
  std::uint64_t read = 0;
  while (left > 0) {
    if (buffer.size() == 0) {
      if (co_await fill(stream, buffer, 1)) co_return false;
    }
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), left));
    buffer.consume(len);
    left -= len;
    read += len;
    const std::string line = std::to_string(read) + "\n";
    if (!co_await write_text(stream, hex(line.size()) + "\r\n" + line + "\r\n")) co_return false;
  }
  ++stats.duplex_done;
  co_return co_await write_text(stream, "0\r\n\r\n");
}

/// /sse: an event stream that stays open, quiet, until the peer goes (SPEC C48).
asio::awaitable<void> event_stream(beast::tcp_stream& stream, bool head) {
  ++stats.sse_open;
  if (head) {
    const std::string event = "data: hello\n\n";
    co_await write_text(stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n" +
                            hex(event.size()) + "\r\n" + event + "\r\n");
  }
  char byte = 0;
  boost::system::error_code ec;
  while (!ec) {
    auto [rec, n] = co_await stream.async_read_some(asio::buffer(&byte, 1), use_nothrow);
    ec = rec;
  }
  --stats.sse_open;
  ++stats.sse_closed;
  log_line("event stream closed by the peer", {{"error", ec.message()}});
}

bool upgrade_names(const bhttp::request_header<>& req, std::string_view protocol) {
  const auto value = req[bhttp::field::upgrade];
  std::string_view rest(value.data(), value.size());
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view token = rest.substr(0, comma);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
      token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    const auto slash = token.find('/');
    if (beast::iequals(token.substr(0, slash), protocol)) return true;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return false;
}

asio::awaitable<void> echo(beast::tcp_stream stream,
                           bhttp::request<bhttp::buffer_body> upgrade_request) {
  websocket::stream<beast::tcp_stream> ws(std::move(stream));
  auto [aec] = co_await ws.async_accept(upgrade_request, use_nothrow);
  if (aec) {
    log_line("websocket accept failed", {{"error", aec.message()}});
    co_return;
  }
  ++stats.ws_sessions;
  ++stats.ws_open;
  beast::flat_buffer buffer;
  boost::system::error_code ec;
  for (;;) {
    auto [rec, n] = co_await ws.async_read(buffer, use_nothrow);
    if (rec) {
      ec = rec;
      break;
    }
    ++stats.ws_messages;
    ws.text(ws.got_text());
    auto [wec, wn] = co_await ws.async_write(buffer.data(), use_nothrow);
    buffer.consume(buffer.size());
    if (wec) {
      ec = wec;
      break;
    }
  }
  --stats.ws_open;
  log_line("websocket ended", {{"error", ec.message()}});
}

asio::awaitable<void> serve(tcp::socket socket) {
  ++stats.connections;
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    bhttp::request_parser<bhttp::buffer_body> parser;
    parser.body_limit(boost::none);
    parser.header_limit(64 * 1024);
    auto [ec, n] = co_await bhttp::async_read_header(stream, buffer, parser, use_nothrow);
    if (ec) break;
    ++stats.requests;
    const std::string target(parser.get().target());
    const std::string path = target.substr(0, target.find('?'));
    const auto query = query_of(target);
    const bool keep_alive = parser.get().keep_alive();

    if (upgrade_names(parser.get().base(), "h2c")) {
      // A gateway that forwards this Upgrade would have the client speak HTTP/2 to it next.
      ++stats.h2c_upgrades;
      co_await write_text(stream,
                          "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                          "Upgrade: h2c\r\n\r\n");
      break;
    }
    if (path == "/bad-upgrade") {
      // A 101 that does not switch to what the client asked for (SPEC C40).
      ++stats.bad_upgrades;
      const auto it = query.find("upgrade");
      const std::string upgrade = it == query.end() ? "" : it->second;
      // Built before the co_await: GCC 12 mishandles a conditional's temporaries inside one.
      std::string answer = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n";
      if (!upgrade.empty()) answer += "Upgrade: " + upgrade + "\r\n";
      answer += "\r\n";
      co_await write_text(stream, answer);
      break;
    }
    if (path == "/early") {
      co_await early_answer(stream, buffer, parser, query);
      break;
    }
    if (path == "/duplex") {
      if (!co_await duplex(stream, buffer, parser, keep_alive)) break;
      if (keep_alive) continue;
      break;
    }
    if (path == "/sse") {
      co_await event_stream(stream, number(query, "head", 1) != 0);
      break;
    }
    if (path == "/ws" && websocket::is_upgrade(parser.get())) {
      co_await echo(std::move(stream), parser.release());
      co_return;
    }

    if (path == "/sink") {
      ++stats.sink_requests;
      const BodyResult body =
          co_await read_sink_body(stream, buffer, parser, number(query, "rate"));
      if (body.error) {
        ++stats.sink_incomplete;
        log_line("sink body ended early", {{"bytes", body.bytes}, {"error", body.error.message()}});
        break;
      }
      ++stats.sink_done;
      const json::object answer{{"bytes", body.bytes}, {"pattern_ok", body.pattern_ok}};
      if (!co_await write_response(stream, 200, "OK", "application/json", json::serialize(answer),
                                   keep_alive))
        break;
    } else if (const BodyResult body = co_await read_body(stream, buffer, parser, 0); body.error) {
      break;
    } else if (path == "/bytes") {
      const std::uint64_t n_bytes = number(query, "n");
      const bool ok =
          co_await write_pattern_body(stream, n_bytes, n_bytes, number(query, "chunked") != 0,
                                      number(query, "rate"), keep_alive);
      if (!ok) {
        ++stats.bytes_responses_failed;
        break;
      }
      ++stats.bytes_responses_done;
    } else if (path == "/die") {
      const std::uint64_t n_bytes = number(query, "n");
      co_await write_pattern_body(stream, n_bytes, number(query, "total", n_bytes),
                                  number(query, "chunked") != 0, 0, keep_alive);
      ++stats.died;
      boost::system::error_code ignored;
      stream.socket().close(ignored);
      co_return;
    } else if (path == "/headers") {
      ++stats.headers_requests;
      json::array fields;
      for (const auto& f : parser.get()) fields.push_back(json::array{f.name_string(), f.value()});
      const json::object answer{{"method", parser.get().method_string()},
                                {"target", target},
                                {"headers", std::move(fields)}};
      if (!co_await write_response(stream, 200, "OK", "application/json", json::serialize(answer),
                                   keep_alive))
        break;
    } else if (path == "/stats") {
      if (!co_await write_response(stream, 200, "OK", "application/json",
                                   json::serialize(stats_json()), keep_alive))
        break;
    } else if (path == "/ws") {
      if (!co_await write_response(stream, 426, "Upgrade Required", "text/plain",
                                   "websocket upgrade expected\n", keep_alive))
        break;
    } else {
      if (!co_await write_response(stream, 404, "Not Found", "text/plain", "no such path\n",
                                   keep_alive))
        break;
    }
    if (!keep_alive) {
      boost::system::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
      break;
    }
  }
}

asio::awaitable<void> accept_loop(tcp::acceptor& acceptor) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(use_nothrow);
    if (ec) co_return;
    asio::co_spawn(acceptor.get_executor(), serve(std::move(socket)), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        log_line("connection failed", {{"error", ex.what()}});
      }
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  std::string listen = "127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else {
      std::cerr << "usage: stream-upstream [--listen HOST:PORT]\n";
      return 2;
    }
  }
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "--listen wants HOST:PORT\n";
    return 2;
  }
  try {
    asio::io_context io{1};
    const tcp::endpoint endpoint(asio::ip::make_address(listen.substr(0, colon)),
                                 static_cast<std::uint16_t>(std::stoul(listen.substr(colon + 1))));
    tcp::acceptor acceptor(io, endpoint);
    asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      log_line("stopping", {{"signal", signo}});
      io.stop();
    });
    const auto bound = acceptor.local_endpoint();
    log_line("listening", {{"address", bound.address().to_string()}, {"port", bound.port()}});
    asio::co_spawn(io, accept_loop(acceptor), asio::detached);
    io.run();
  } catch (const std::exception& e) {
    log_line("failed", {{"error", e.what()}});
    return 1;
  }
  return 0;
}
