// Streaming and protocol upgrades end to end (SPEC C38, C40): the real idemgate in front of
// stream-upstream, driven over raw client sockets so that a test sees bytes as they arrive and
// decides when to read. Bodies follow stream-upstream's pattern (byte i = i % 251), so every
// byte is checked without holding a body; the upstream's counters tell how far it got.
#define BOOST_TEST_MODULE streaming_e2e
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/websocket/stream.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "tests/ops/ops_support.hpp"
#include "tests/support/pattern_body.hpp"
#include "tests/support/process_memory.hpp"
#include "tests/support/scraping.hpp"
#include "tests/support/spec_bounds.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::e2e;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;
constexpr std::size_t kPiece = 64 * kKiB;
/// SPEC C38: a 1 GiB transfer grows the gateway's RSS by less than this.
constexpr std::uint64_t kRssBudget = 32 * kMiB;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using idemgate::test::fill_pattern;
using idemgate::test::pattern_matches;

/// Runs one asynchronous operation on `io` to completion, or closes `socket` after `timeout`
/// (then the result is asio::error::timed_out). Blocking calls with a bound, without a clock.
template <class Start>
boost::system::error_code run_bounded(asio::io_context& io, tcp::socket& socket,
                                      std::chrono::milliseconds timeout, Start start) {
  boost::system::error_code ec;
  bool done = false;
  io.restart();
  start([&ec, &done](boost::system::error_code e, auto&&...) {
    ec = e;
    done = true;
  });
  io.run_for(timeout);
  if (!done) {
    boost::system::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();
    return asio::error::timed_out;
  }
  return ec;
}

using ResponseParser = bhttp::response_parser<bhttp::buffer_body>;

/// A client connection with byte-level control: raw writes, the response header, then the body
/// piece by piece at the pace the test chooses. Every operation is bounded by `timeout`.
class RawClient {
 public:
  /// `receive_buffer` (bytes, 0: the system's) is set before connecting, so that a client
  /// that stops reading holds back the sender soon.
  explicit RawClient(std::uint16_t port, std::chrono::milliseconds timeout = 30s,
                     int receive_buffer = 0)
      : socket_(io_), timeout_(timeout) {
    socket_.open(tcp::v4());
    if (receive_buffer > 0) socket_.set_option(tcp::socket::receive_buffer_size(receive_buffer));
    const tcp::endpoint endpoint(asio::ip::make_address(kLoopback), port);
    const auto ec = run([&](auto done) { socket_.async_connect(endpoint, done); });
    if (ec) throw boost::system::system_error(ec, "connect");
    parser_.body_limit(boost::none);
  }

  boost::system::error_code write(std::string_view bytes) {
    return run([&](auto done) {
      asio::async_write(socket_, asio::buffer(bytes.data(), bytes.size()), done);
    });
  }

  /// Reads the response header into parser().
  boost::system::error_code read_header() {
    return run([&](auto done) { bhttp::async_read_header(socket_, buffer_, parser_, done); });
  }

  /// Reads up to `size` body bytes into `data`; `got` tells how many. Returns once `size` bytes
  /// came or the body ended, or with `as_arrived` once any came. No error and
  /// parser().is_done(): the body is complete.
  boost::system::error_code read_body(char* data, std::size_t size, std::size_t& got,
                                      bool as_arrived = false) {
    parser_.get().body().data = data;
    parser_.get().body().size = size;
    auto ec = run([&](auto done) {
      if (as_arrived) {
        bhttp::async_read_some(socket_, buffer_, parser_, done);
      } else {
        bhttp::async_read(socket_, buffer_, parser_, done);
      }
    });
    if (ec == bhttp::error::need_buffer) ec = {};
    got = size - parser_.get().body().size;
    return ec;
  }

  /// Reads raw bytes (after the response: to see whether the peer closed).
  boost::system::error_code read_some(char* data, std::size_t size, std::size_t& got) {
    got = 0;
    if (buffer_.size() > 0) {
      got = asio::buffer_copy(asio::buffer(data, size), buffer_.data());
      buffer_.consume(got);
      return {};
    }
    return run([&](auto done) {
      socket_.async_read_some(asio::buffer(data, size),
                              [&got, done](boost::system::error_code e, std::size_t n) mutable {
                                got = n;
                                done(e);
                              });
    });
  }

  ResponseParser& parser() { return parser_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  /// Closes the connection: a FIN, or with `reset` an RST (SO_LINGER with a zero timeout).
  void close(bool reset = false) {
    boost::system::error_code ignored;
    if (reset) socket_.set_option(tcp::socket::linger(true, 0), ignored);
    socket_.close(ignored);
  }

 private:
  template <class Start>
  boost::system::error_code run(Start start) {
    return run_bounded(io_, socket_, timeout_, start);
  }

  asio::io_context io_;
  tcp::socket socket_;
  std::chrono::milliseconds timeout_;
  beast::flat_buffer buffer_;
  ResponseParser parser_;
};

/// How a response read piece by piece ended.
struct Download {
  unsigned status = 0;
  HeaderList headers;
  std::uint64_t bytes = 0;
  bool pattern_ok = true;
  bool complete = false;            ///< the body ended by its framing (or by EOF, close-delimited)
  boost::system::error_code error;  ///< what ended it otherwise
  std::string text;  ///< the body as text (up to 64 KiB), when it is not a pattern body

  std::optional<std::string> header(std::string_view name) const {
    for (const auto& [key, value] : headers)
      if (beast::iequals(key, name)) return value;
    return std::nullopt;
  }
  std::string describe() const {
    std::ostringstream out;
    out << "status " << status << ", " << bytes << " body bytes, complete " << complete
        << ", pattern_ok " << pattern_ok << ", error '" << error.message() << "'";
    for (const auto& [k, v] : headers) out << "\n" << k << ": " << v;
    if (!text.empty()) out << "\n\n" << text.substr(0, 2000);
    return out.str();
  }
};

/// Reads the response on `client` piece by piece (`piece` bytes at most), checking the pattern
/// on a 200 when `pattern` (else keeping the body as text); `after_piece(bytes so far)` runs
/// after each piece.
Download read_download(RawClient& client,
                       const std::function<void(std::uint64_t)>& after_piece = {},
                       bool pattern = true, std::size_t piece = kPiece) {
  Download d;
  d.error = client.read_header();
  if (d.error) return d;
  const auto& res = client.parser().get();
  d.status = res.result_int();
  for (const auto& f : res) d.headers.emplace_back(f.name_string(), f.value());
  std::vector<char> buffer(piece);
  // A Content-Length body is read off the socket as it is: Beast's parser costs milliseconds a
  // piece in the unoptimised sanitizer build, which would dominate a GiB.
  const auto content_length = client.parser().content_length();
  const bool raw = content_length && !client.parser().chunked() && !client.parser().is_done();
  while (raw ? d.bytes < *content_length : !client.parser().is_done()) {
    std::size_t got = 0;
    auto ec = raw ? client.read_some(buffer.data(),
                                     static_cast<std::size_t>(std::min<std::uint64_t>(
                                         buffer.size(), *content_length - d.bytes)),
                                     got)
                  : client.read_body(buffer.data(), buffer.size(), got);
    if (pattern && d.status == 200) {
      if (d.pattern_ok && !pattern_matches(buffer.data(), got, d.bytes)) d.pattern_ok = false;
    } else if (d.text.size() < 64 * kKiB) {
      d.text.append(buffer.data(), got);
    }
    d.bytes += got;
    if (ec) {
      d.error = ec;
      return d;
    }
    if (after_piece) after_piece(d.bytes);
  }
  d.complete = true;
  return d;
}

std::string get_request(const std::string& target, const std::string& version = "HTTP/1.1",
                        const std::string& host = "gateway.test") {
  return "GET " + target + " " + version + "\r\nHost: " + host + "\r\n\r\n";
}

/// A connection error (the peer closed or reset), as opposed to a timeout of the test's own.
bool closed_by_peer(const boost::system::error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == bhttp::error::partial_message ||
         ec == bhttp::error::end_of_stream;
}

/// The string member `key` of `o` ("" when absent or not a string).
std::string str(const json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : "";
}

/// Lines of `text` after its first `from` characters that contain, case-insensitively, any of
/// `words` (the exchange was cut and the gateway said why).
std::vector<std::string> log_lines_with(const std::string& text, std::size_t from,
                                        std::initializer_list<std::string_view> words) {
  std::vector<std::string> out;
  std::istringstream in(text.substr(std::min(from, text.size())));
  std::string line;
  while (std::getline(in, line)) {
    std::string lower = line;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const auto word : words)
      if (lower.find(word) != std::string::npos) {
        out.push_back(line);
        break;
      }
  }
  return out;
}

/// `upstream:` up, plus the routes: `no-upgrade.test` and `tunnel.test` (with
/// `upgrade: [websocket]` when `tunnels`) by host, everything else on `all`; all `mode: off`.
GatewayConfig stream_config(const StreamUpstream& upstream, const std::string& limits,
                            bool tunnels = false) {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.limits = limits;
  std::string routes;
  if (tunnels) {
    routes +=
        "  - name: no-upgrade\n"
        "    match: { host: no-upgrade.test, path_prefix: / }\n"
        "    upstream: up\n"
        "    idempotency: { mode: \"off\" }\n"
        "  - name: tunnel\n"
        "    match: { host: tunnel.test, path_prefix: / }\n"
        "    upstream: up\n"
        "    upgrade: [websocket]\n"
        "    idempotency: { mode: \"off\" }\n";
  }
  routes +=
      "  - name: all\n"
      "    match: { path_prefix: / }\n"
      "    upstream: up\n"
      "    idempotency: { mode: \"off\" }\n";
  config.routes_yaml = routes;
  return config;
}

const std::string kDefaultLimits = "{ max_request_body: 1MiB, drain_timeout: 2s }";
/// The drain_timeout of kDefaultLimits.
constexpr auto kDefaultDrainTimeout = 2s;

/// A WebSocket client with blocking, bounded operations.
class WsClient {
 public:
  WsClient(std::uint16_t port, const std::string& host, const std::string& target,
           std::chrono::milliseconds timeout = kEventDeadline)
      : ws_(io_), timeout_(timeout) {
    auto& socket = ws_.next_layer();
    const tcp::endpoint endpoint(asio::ip::make_address(kLoopback), port);
    auto ec = run([&](auto done) { socket.async_connect(endpoint, done); });
    if (ec) throw boost::system::system_error(ec, "connect");
    ec = run([&](auto done) { ws_.async_handshake(response_, host, target, done); });
    if (ec)
      throw std::runtime_error("WebSocket handshake failed: " + ec.message() + "; status " +
                               std::to_string(response_.result_int()));
  }

  boost::system::error_code send(const std::string& payload, bool binary) {
    ws_.binary(binary);
    return run([&](auto done) { ws_.async_write(asio::buffer(payload), done); });
  }

  boost::system::error_code receive(std::string& payload) {
    beast::flat_buffer buffer;
    const auto ec = run([&](auto done) { ws_.async_read(buffer, done); });
    payload = beast::buffers_to_string(buffer.data());
    return ec;
  }

  boost::system::error_code close() {
    return run([&](auto done) { ws_.async_close(websocket::close_code::normal, done); });
  }

  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  template <class Start>
  boost::system::error_code run(Start start) {
    return run_bounded(io_, ws_.next_layer(), timeout_, start);
  }

  asio::io_context io_;
  websocket::stream<tcp::socket> ws_;
  websocket::response_type response_;
  std::chrono::milliseconds timeout_;
};

/// The fields of a WebSocket upgrade request (RFC 6455 §4.1) to `host`.
HeaderList websocket_upgrade(const std::string& host) {
  return {{"Host", host},
          {"Connection", "Upgrade"},
          {"Upgrade", "websocket"},
          {"Sec-WebSocket-Version", "13"},
          {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}};
}

std::string pattern_text(std::size_t n, std::uint64_t offset = 0) {
  std::string s(n, '\0');
  fill_pattern(s.data(), n, offset);
  return s;
}

/// Writes `total` pattern bytes after `head` in 64 KiB pieces, chunked or as they are; stops at
/// the first failed write and returns its error. `sent` counts the body bytes written.
boost::system::error_code upload(RawClient& client, const std::string& head, std::uint64_t total,
                                 bool chunked, std::uint64_t& sent) {
  sent = 0;
  if (auto ec = client.write(head)) return ec;
  std::string piece(kPiece, '\0');
  char size_line[32];
  while (sent < total) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, total - sent));
    fill_pattern(piece.data(), len, sent);
    std::string_view data(piece.data(), len);
    std::string framed;
    if (chunked) {
      std::snprintf(size_line, sizeof size_line, "%zx\r\n", len);
      framed.reserve(len + 16);
      framed.append(size_line).append(data).append("\r\n");
      data = framed;
    }
    if (auto ec = client.write(data)) return ec;
    sent += len;
  }
  if (chunked) return client.write("0\r\n\r\n");
  return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(streaming)

BOOST_AUTO_TEST_CASE(spec_C38_a_1_gib_download_passes_with_bounded_gateway_rss) {
  StreamUpstream upstream;
  const SmallAsanQuarantine quarantine;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  {
    // Warm the gateway up (threads, pools, first allocations) before the idle baseline.
    RawClient warm(gateway.port());
    BOOST_TEST_REQUIRE(!warm.write(get_request("/bytes?n=" + std::to_string(4 * kMiB))));
    const Download d = read_download(warm);
    BOOST_TEST_REQUIRE(d.complete, d.describe());
  }
  RssSampler rss(gateway.pid());
  std::this_thread::sleep_for(200ms);
  const std::uint64_t idle = rss.rss();

  const auto start = Clock::now();
  RawClient client(gateway.port());
  BOOST_TEST_REQUIRE(!client.write(get_request("/bytes?n=" + std::to_string(kGiB))));
  const Download d = read_download(client);
  const double elapsed = seconds_since(start);
  BOOST_TEST_MESSAGE("1 GiB download: " << elapsed << " s, gateway RSS idle " << idle / kKiB
                                        << " KiB, max " << rss.max() / kKiB << " KiB");
  BOOST_TEST(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.complete, d.describe());
  BOOST_TEST(d.bytes == kGiB);
  BOOST_TEST(d.pattern_ok);
  BOOST_TEST(rss.max() - std::min(rss.max(), idle) < kRssBudget, "the gateway's RSS grew from "
                                                                     << idle / kKiB << " KiB to "
                                                                     << rss.max() / kKiB << " KiB");
}

BOOST_AUTO_TEST_CASE(spec_C38_a_1_gib_upload_passes_with_bounded_gateway_rss) {
  StreamUpstream upstream;
  const SmallAsanQuarantine quarantine;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  {
    RawClient warm(gateway.port());
    std::uint64_t sent = 0;
    const std::string head = "POST /sink HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                             std::to_string(512 * kKiB) + "\r\n\r\n";
    BOOST_TEST_REQUIRE(!upload(warm, head, 512 * kKiB, false, sent));
    const Download d = read_download(warm, {}, false);
    BOOST_TEST_REQUIRE(d.complete, d.describe());
  }
  RssSampler rss(gateway.pid());
  std::this_thread::sleep_for(200ms);
  const std::uint64_t idle = rss.rss();

  for (const bool chunked : {false, true}) {
    BOOST_TEST_CONTEXT((chunked ? "chunked" : "Content-Length") << " upload") {
      const auto start = Clock::now();
      RawClient client(gateway.port());
      const std::string head =
          "POST /sink HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: "
          "application/octet-stream\r\n" +
          (chunked ? std::string("Transfer-Encoding: chunked\r\n")
                   : "Content-Length: " + std::to_string(kGiB) + "\r\n") +
          "\r\n";
      std::uint64_t sent = 0;
      const auto wec = upload(client, head, kGiB, chunked, sent);
      // An early answer (e.g. 413) shows in the response rather than in the failed write.
      const Download d = read_download(client, {}, false);
      const double elapsed = seconds_since(start);
      BOOST_TEST_MESSAGE((chunked ? "chunked" : "Content-Length")
                         << " 1 GiB upload: " << elapsed << " s, gateway RSS idle " << idle / kKiB
                         << " KiB, max " << rss.max() / kKiB << " KiB");
      BOOST_TEST(!wec, "write failed after " << sent << " bytes: " << wec.message() << "; "
                                             << d.describe());
      BOOST_TEST(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
      if (d.status != 200) continue;  // the other variant still runs
      BOOST_TEST(d.complete, d.describe());
      const json::value answer = json::parse(d.text);
      BOOST_TEST(answer.at("bytes").to_number<std::uint64_t>() == kGiB, d.text);
      BOOST_TEST(answer.at("pattern_ok").as_bool(), d.text);
    }
  }
  // The warm-up and both uploads.
  BOOST_TEST(upstream.counter("sink_done") == 3u);
  BOOST_TEST(upstream.counter("sink_bytes_total") == 2 * kGiB + 512 * kKiB);
  BOOST_TEST(rss.max() - std::min(rss.max(), idle) < kRssBudget, "the gateway's RSS grew from "
                                                                     << idle / kKiB << " KiB to "
                                                                     << rss.max() / kKiB << " KiB");
}

BOOST_AUTO_TEST_CASE(spec_C38_first_bytes_arrive_before_the_upstream_finished) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  // 512 KiB at 256 KiB/s: the upstream needs two seconds for the whole body.
  const std::uint64_t n = 512 * kKiB;
  RawClient client(gateway.port());
  BOOST_TEST_REQUIRE(!client.write(
      get_request("/bytes?n=" + std::to_string(n) + "&rate=" + std::to_string(256 * kKiB))));
  std::optional<std::uint64_t> written_at_first_bytes;
  const Download d = read_download(client, [&](std::uint64_t) {
    if (!written_at_first_bytes) written_at_first_bytes = upstream.counter("bytes_written_total");
  });
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.complete, d.describe());
  BOOST_TEST(d.bytes == n);
  BOOST_TEST(d.pattern_ok);
  BOOST_TEST_REQUIRE(written_at_first_bytes.has_value());
  BOOST_TEST(*written_at_first_bytes < n, "the upstream had written "
                                              << *written_at_first_bytes << " of " << n
                                              << " bytes when the first ones reached the client");
}

BOOST_AUTO_TEST_CASE(spec_C38_a_slow_reader_that_keeps_progressing_is_not_cut) {
  StreamUpstream upstream;
  Gateway gateway{
      stream_config(upstream, "{ max_request_body: 1MiB, idle_timeout: 1s, drain_timeout: 2s }")};
  // Larger than the kernel's socket buffers on both hops can absorb, so the gateway's writes
  // wait for this client for the whole slow phase.
  const std::uint64_t n = 96 * kMiB;
  RawClient client(gateway.port(), 30s, static_cast<int>(64 * kKiB));
  BOOST_TEST_REQUIRE(!client.write(get_request("/bytes?n=" + std::to_string(n))));
  // ~3 s (three times the idle timeout) of reading 1 MiB, then pausing ~300 ms; then the rest at
  // once. Each pause must free enough of the gateway's socket send buffer for the kernel to
  // report it writable again (a third of it, up to 4 MiB on loopback), or the gateway would
  // see no progress however steadily the client reads.
  const auto slow_until = Clock::now() + 3s;
  std::uint64_t next_pause = kMiB;
  // What the upstream had written when the slow phase ended, read at the first piece after it.
  std::optional<std::uint64_t> written_after_slow_phase;
  const Download d = read_download(client, [&](std::uint64_t bytes) {
    if (written_after_slow_phase) return;
    if (Clock::now() >= slow_until) {
      written_after_slow_phase = upstream.counter("bytes_written_total");
      return;
    }
    if (bytes < next_pause) return;
    std::this_thread::sleep_for(300ms);
    next_pause = bytes + kMiB;
  });
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.complete, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.bytes == n);
  BOOST_TEST(d.pattern_ok);
  // Backpressure: the slow client held the upstream back instead of the gateway buffering.
  BOOST_TEST_REQUIRE(
      written_after_slow_phase.has_value(),
      "the whole body arrived within the slow phase: nothing held the upstream back");
  BOOST_TEST(*written_after_slow_phase < n / 2,
             "the upstream had written " << *written_after_slow_phase << " bytes");
}

BOOST_AUTO_TEST_CASE(spec_C38_a_stalled_reader_is_cut_after_idle_timeout) {
  StreamUpstream upstream;
  Gateway gateway{
      stream_config(upstream, "{ max_request_body: 1MiB, idle_timeout: 1s, drain_timeout: 2s }")};
  const std::uint64_t n = 256 * kMiB;
  const std::string target = "/bytes?n=" + std::to_string(n);
  const std::size_t log_start = gateway.stderr_text().size();
  RawClient client(gateway.port(), 30s, static_cast<int>(64 * kKiB));
  BOOST_TEST_REQUIRE(!client.write(get_request(target)));
  BOOST_TEST_REQUIRE(!client.read_header());
  const unsigned status = client.parser().get().result_int();
  BOOST_TEST_REQUIRE(status == 200u, "status " << status << "\n" << gateway.diagnostics());
  // The client stops reading. Once the buffers are full nothing moves: after idle_timeout the
  // gateway cuts both connections, which the upstream sees as a failed write.
  const auto stalled = Clock::now();
  BOOST_TEST_REQUIRE(upstream.wait_for_counter("bytes_responses_failed", 1),
                     "the upstream connection was not cut\n"
                         << gateway.diagnostics());
  const double cut_after = seconds_since(stalled);
  BOOST_TEST_MESSAGE("upstream side cut " << cut_after << " s after the client stalled");
  BOOST_TEST(cut_after >= 0.9);
  BOOST_TEST(upstream.counter("bytes_written_total") < n);
  // What the kernel still holds is readable; then the connection ends short of the body.
  const Download d = read_download(client);
  BOOST_TEST(!d.complete, d.describe());
  BOOST_TEST(d.bytes < n);
  BOOST_TEST(closed_by_peer(d.error), d.describe());
  const auto lines = log_lines_with(gateway.stderr_text(), log_start, {"idle", "timeout", "cut"});
  BOOST_TEST(!lines.empty(), "no log line says why the exchange was cut:\n"
                                 << gateway.diagnostics());
}

BOOST_AUTO_TEST_CASE(spec_C38_content_length_above_max_streamed_body_is_413_and_not_forwarded) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(
      upstream, "{ max_request_body: 64KiB, max_streamed_body: 1MiB, drain_timeout: 2s }")};
  {
    // Only the header: the answer must not wait for a body the gateway will not forward.
    HttpConnection connection(kLoopback, gateway.port(), 10s);
    connection.send_raw("POST /sink HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                        std::to_string(2 * kMiB) + "\r\n\r\n");
    const HttpResponse res = connection.read_response();
    BOOST_TEST(is_problem(res, 413));
  }
  BOOST_TEST(upstream.counter("sink_requests") == 0u);
  // Below max_streamed_body but above max_request_body: streamed, so it passes (SPEC C04, C38).
  RawClient client(gateway.port());
  std::uint64_t sent = 0;
  const std::uint64_t n = 512 * kKiB;
  BOOST_TEST_REQUIRE(!upload(client,
                             "POST /sink HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                                 std::to_string(n) + "\r\n\r\n",
                             n, false, sent));
  const Download d = read_download(client, {}, false);
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe());
  BOOST_TEST(json::parse(d.text).at("bytes").to_number<std::uint64_t>() == n);
}

BOOST_AUTO_TEST_CASE(spec_C38_chunked_upload_passing_max_streamed_body_is_cut) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(
      upstream, "{ max_request_body: 64KiB, max_streamed_body: 1MiB, drain_timeout: 2s }")};
  const std::size_t log_start = gateway.stderr_text().size();
  RawClient client(gateway.port(), 10s);
  std::uint64_t sent = 0;
  const auto wec = upload(client,
                          "POST /sink HTTP/1.1\r\nHost: gateway.test\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n",
                          4 * kMiB, true, sent);
  BOOST_TEST_MESSAGE("upload ended after " << sent << " bytes: " << wec.message());
  // No response, a cut one, or a 413 problem: never the upstream's answer; then the
  // connection closes.
  const Download d = read_download(client, {}, false);
  if (d.complete) {
    BOOST_TEST(d.status == 413u, d.describe());
    BOOST_TEST(d.header("Content-Type").value_or("") == "application/problem+json", d.describe());
    char byte = 0;
    std::size_t got = 0;
    const auto ec = client.read_some(&byte, 1, got);
    BOOST_TEST(closed_by_peer(ec), "the connection stayed open: " << ec.message());
  } else {
    BOOST_TEST(closed_by_peer(d.error), d.describe());
  }
  // The upstream got the first part as it came, then its connection was closed mid-body.
  BOOST_TEST_REQUIRE(upstream.wait_for_counter("sink_incomplete", 1), gateway.diagnostics());
  BOOST_TEST(upstream.counter("sink_done") == 0u);
  const auto received = upstream.counter("sink_bytes_total");
  BOOST_TEST(received > 0u);
  BOOST_TEST(received <= kMiB);
  const auto lines = log_lines_with(gateway.stderr_text(), log_start,
                                    {"max_streamed_body", "too large", "limit", "cut"});
  BOOST_TEST(!lines.empty(), "no log line says why the upload was cut:\n" << gateway.diagnostics());
}

BOOST_AUTO_TEST_CASE(spec_C38_an_http10_client_gets_a_close_delimited_body) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  // A chunked upstream body: its length is unknown until its end.
  const std::uint64_t n = 3 * kMiB;
  RawClient client(gateway.port());
  BOOST_TEST_REQUIRE(
      !client.write(get_request("/bytes?chunked=1&n=" + std::to_string(n), "HTTP/1.0")));
  const Download d = read_download(client);
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(!d.header("Transfer-Encoding").has_value(), d.describe());
  BOOST_TEST(!d.header("Content-Length").has_value(),
             "a streamed body of unknown length has no Content-Length: " << d.describe());
  BOOST_TEST(d.complete, d.describe());
  BOOST_TEST(d.bytes == n);
  BOOST_TEST(d.pattern_ok);
  // Neither length nor chunks: the parser could only end the body at the connection's close.
  BOOST_TEST(client.parser().need_eof(), d.describe());
}

BOOST_AUTO_TEST_CASE(spec_C38_an_upstream_dying_mid_body_ends_the_client_response_visibly) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  const std::uint64_t n = 300 * kKiB;
  const std::uint64_t total = 2 * kMiB;
  for (const bool chunked : {false, true}) {
    BOOST_TEST_CONTEXT((chunked ? "chunked" : "Content-Length") << " upstream body") {
      RawClient client(gateway.port());
      BOOST_TEST_REQUIRE(!client.write(get_request("/die?n=" + std::to_string(n) +
                                                   "&total=" + std::to_string(total) +
                                                   (chunked ? "&chunked=1" : ""))));
      const Download d = read_download(client);
      BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
      if (chunked) {
        BOOST_TEST(d.header("Transfer-Encoding").value_or("") == "chunked", d.describe());
      } else {
        BOOST_TEST(d.header("Content-Length").value_or("") == std::to_string(total), d.describe());
      }
      // Cut: fewer bytes than announced, or no terminating chunk; the connection closed.
      BOOST_TEST(!d.complete, d.describe());
      BOOST_TEST(d.bytes <= n);
      BOOST_TEST(d.pattern_ok);
      BOOST_TEST(closed_by_peer(d.error), d.describe());
    }
  }
  BOOST_TEST(upstream.counter("died") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C40_websocket_echo_through_a_tunnel) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};
  WsClient ws(gateway.port(), "tunnel.test", "/ws");
  for (int i = 0; i < 5; ++i) {
    const bool binary = i % 2 == 1;
    // Text messages, and binary ones larger than one stream_buffer.
    const std::string message = binary ? pattern_text(100 * kKiB + static_cast<std::size_t>(i),
                                                      static_cast<std::uint64_t>(i))
                                       : "hello " + std::to_string(i);
    BOOST_TEST_REQUIRE(!ws.send(message, binary));
    std::string echoed;
    const auto ec = ws.receive(echoed);
    BOOST_TEST_REQUIRE(!ec, ec.message());
    BOOST_TEST((echoed == message), "message " << i << " came back changed (" << echoed.size()
                                               << " bytes of " << message.size() << ")");
  }
  BOOST_TEST(!ws.close());
  BOOST_TEST(upstream.counter("ws_sessions") == 1u);
  BOOST_TEST(upstream.counter("ws_messages") == 5u);
  BOOST_TEST(upstream.wait_for_counter_equal("ws_open", 0));
}

BOOST_AUTO_TEST_CASE(spec_C40_an_idle_tunnel_is_closed_after_tunnel_idle_timeout) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(
      upstream, "{ max_request_body: 1MiB, tunnel_idle_timeout: 1s, drain_timeout: 2s }", true)};
  WsClient ws(gateway.port(), "tunnel.test", "/ws");
  BOOST_TEST_REQUIRE(!ws.send("ping", false));
  std::string echoed;
  BOOST_TEST_REQUIRE(!ws.receive(echoed));
  // Nothing moves from here: the gateway closes the tunnel after tunnel_idle_timeout (1 s; the
  // default idle_timeout of 60 s does not apply to it). SPEC C40 states no bound on how soon
  // after: the client's read deadline (kEventDeadline) only keeps a gateway that never closes
  // it from hanging the case.
  const auto quiet = Clock::now();
  const auto ec = ws.receive(echoed);
  const double closed_after = seconds_since(quiet);
  BOOST_TEST_MESSAGE("tunnel closed " << closed_after
                                      << " s after the last message: " << ec.message());
  BOOST_TEST((ec && ec != asio::error::timed_out), ec.message());
  BOOST_TEST(closed_after >= 0.9);
  BOOST_TEST(upstream.wait_for_counter_equal("ws_open", 0), "the upstream side stayed open");
}

BOOST_AUTO_TEST_CASE(spec_C52_an_upgrade_past_max_tunnels_gets_503_and_is_not_forwarded) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(
      upstream, "{ max_request_body: 1MiB, drain_timeout: 2s, max_tunnels: 2 }", true)};
  auto first = std::make_unique<WsClient>(gateway.port(), "tunnel.test", "/ws");
  WsClient second(gateway.port(), "tunnel.test", "/ws");
  for (WsClient* ws : {first.get(), &second}) {
    BOOST_TEST_REQUIRE(!ws->send("ping", false));
    std::string echoed;
    BOOST_TEST_REQUIRE(!ws->receive(echoed));
  }

  // The third upgrade: answered by the gateway, never forwarded.
  HttpConnection connection(kLoopback, gateway.port(), 10s);
  const HttpResponse refused =
      connection.request({"GET",
                          "/ws",
                          {{"Host", "tunnel.test"},
                           {"Connection", "Upgrade"},
                           {"Upgrade", "websocket"},
                           {"Sec-WebSocket-Version", "13"},
                           {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}},
                          ""});
  BOOST_TEST(is_problem(refused, 503), gateway.explain(refused));
  BOOST_TEST(problem_type(refused) == "https://idemgate.dev/problems/overloaded");
  BOOST_TEST(refused.header("Retry-After").has_value(), describe(refused));
  BOOST_TEST(upstream.counter("ws_sessions") == 2u);
  // The refused connection still carries ordinary requests.
  const HttpResponse next = connection.request({"GET", "/stats", {{"Host", "tunnel.test"}}, ""});
  BOOST_TEST(next.status == 200u, describe(next));
  const std::string metrics = gateway.admin_get("/metrics").body;
  BOOST_TEST(
      metric_value(metrics, "idemgate_requests_total", {{"route", "tunnel"}, {"outcome", "shed"}})
              .value_or(0) == 1.0,
      metrics);

  // Once a tunnel ends, an upgrade passes again.
  BOOST_TEST(!first->close());
  first.reset();
  std::unique_ptr<WsClient> third;
  BOOST_TEST(eventually([&] {
    try {
      third = std::make_unique<WsClient>(gateway.port(), "tunnel.test", "/ws");
      return true;
    } catch (const std::exception&) {
      return false;  // the first tunnel's end has not reached the gateway yet
    }
  }));
  BOOST_REQUIRE(third);
  BOOST_TEST_REQUIRE(!third->send("again", false));
  std::string echoed;
  BOOST_TEST(!third->receive(echoed));
  BOOST_TEST(echoed == "again");
}

BOOST_AUTO_TEST_CASE(spec_C40_h2c_is_never_tunnelled_and_upgrade_is_stripped) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};
  // On the websocket route and elsewhere alike.
  for (const std::string host : {"tunnel.test", "gateway.test"}) {
    BOOST_TEST_CONTEXT("Host " << host) {
      HttpConnection connection(kLoopback, gateway.port(), 10s);
      const HttpResponse res = connection.request({"GET",
                                                   "/headers",
                                                   {{"Host", host},
                                                    {"Connection", "Upgrade, HTTP2-Settings"},
                                                    {"Upgrade", "h2c"},
                                                    {"HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"}},
                                                   ""});
      BOOST_TEST_REQUIRE(res.status == 200u, gateway.explain(res));
      BOOST_TEST(!res.header("Upgrade").has_value(), describe(res));
      const json::value seen = json::parse(res.body);
      for (const auto& field : seen.at("headers").as_array()) {
        const std::string name(field.as_array().at(0).as_string());
        BOOST_TEST(!beast::iequals(name, "Upgrade"), res.body);
        BOOST_TEST(!beast::iequals(name, "HTTP2-Settings"), res.body);
        BOOST_TEST(!beast::iequals(name, "Connection"), res.body);
      }
      // The connection is still plain HTTP/1.1.
      const HttpResponse next = connection.request({"GET", "/stats", {{"Host", host}}, ""});
      BOOST_TEST(next.status == 200u, describe(next));
    }
  }
  BOOST_TEST(upstream.counter("h2c_upgrades") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_a_list_of_equal_content_lengths_goes_upstream_as_one_value) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  // Accepted as one length (RFC 9110 §8.6); forwarded as received, an upstream that reads the
  // list as no length would take the body for a request of its own.
  for (const std::string lengths : {"Content-Length: 3, 3\r\n", "Content-Length: 3,3\r\n",
                                    "Content-Length: 3\r\nContent-Length: 3\r\n"}) {
    BOOST_TEST_CONTEXT(lengths) {
      HttpConnection connection(kLoopback, gateway.port(), 10s);
      connection.send_raw("POST /headers HTTP/1.1\r\nHost: gateway.test\r\n" + lengths +
                          "Connection: close\r\n\r\nabc");
      const HttpResponse res = connection.read_response();
      BOOST_TEST_REQUIRE(res.status == 200u, gateway.explain(res));
      std::vector<std::string> seen;
      const json::value fields = json::parse(res.body);
      for (const auto& field : fields.at("headers").as_array()) {
        if (beast::iequals(field.as_array().at(0).as_string(), "Content-Length"))
          seen.emplace_back(field.as_array().at(1).as_string());
      }
      const std::vector<std::string> one = {"3"};
      BOOST_TEST(seen == one, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C40_websocket_on_a_route_without_upgrade_is_not_tunnelled) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};
  const HeaderList upgrade = websocket_upgrade("no-upgrade.test");
  HttpConnection connection(kLoopback, gateway.port(), 10s);
  // The upstream answers a /ws request without an upgrade with 426: an ordinary response.
  const HttpResponse res = connection.request({"GET", "/ws", upgrade, ""});
  BOOST_TEST(res.status == 426u, gateway.explain(res));
  BOOST_TEST(!res.header("Upgrade").has_value(), describe(res));
  const HttpResponse seen = connection.request({"GET", "/headers", upgrade, ""});
  BOOST_TEST_REQUIRE(seen.status == 200u, gateway.explain(seen));
  const json::value fields = json::parse(seen.body);
  for (const auto& field : fields.at("headers").as_array()) {
    const std::string name(field.as_array().at(0).as_string());
    BOOST_TEST(!beast::iequals(name, "Upgrade"), seen.body);
    BOOST_TEST(!beast::iequals(name, "Connection"), seen.body);
  }
  BOOST_TEST(upstream.counter("ws_sessions") == 0u);
  BOOST_CHECK_THROW(WsClient(gateway.port(), "no-upgrade.test", "/ws"), std::exception);
  BOOST_TEST(upstream.counter("ws_sessions") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C40_a_tunnel_logs_bytes_in_and_out_and_counts_open_tunnels) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};
  const std::uint16_t admin = gateway.admin_port();
  const auto open_tunnels = [&] {
    const HttpResponse res = http_request(kLoopback, admin, {"GET", "/metrics", {}, ""});
    return metric_value(res.body, "idemgate_open_tunnels");
  };
  const std::size_t size = 10000;
  {
    WsClient ws(gateway.port(), "tunnel.test", "/ws");
    for (int i = 0; i < 3; ++i) {
      BOOST_TEST_REQUIRE(!ws.send(pattern_text(size), true));
      std::string echoed;
      BOOST_TEST_REQUIRE(!ws.receive(echoed));
      BOOST_TEST(echoed.size() == size);
    }
    const auto gauge = open_tunnels();
    BOOST_TEST_REQUIRE(gauge.has_value(), "no idemgate_open_tunnels on /metrics");
    BOOST_TEST(*gauge == 1.0);
    BOOST_TEST(!ws.close());
  }
  const auto deadline = Clock::now() + kEventDeadline;
  while (open_tunnels().value_or(-1) != 0.0 && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  BOOST_TEST(open_tunnels().value_or(-1) == 0.0);

  std::vector<json::object> tunnels;
  for (const auto& o : log_lines(gateway.stderr_text()))
    if (str(o, "outcome") == "tunnel") tunnels.push_back(o);
  BOOST_TEST_REQUIRE(tunnels.size() == 1u, gateway.diagnostics());
  const json::object& line = tunnels.front();
  BOOST_TEST(str(line, "route") == "tunnel");
  BOOST_TEST(line.at("status").to_number<unsigned>() == 101u);
  // Each way at least the three payloads (frame headers and masks come on top).
  BOOST_TEST(line.at("bytes_in").to_number<std::uint64_t>() >= 3 * size, json::serialize(line));
  BOOST_TEST(line.at("bytes_out").to_number<std::uint64_t>() >= 3 * size, json::serialize(line));
  BOOST_TEST(line.at("total_ms").to_number<double>() >= 0.0, json::serialize(line));
}

BOOST_AUTO_TEST_CASE(spec_C40_sigterm_closes_tunnels_at_the_end_of_drain_timeout) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};  // drain_timeout: 2s
  WsClient ws(gateway.port(), "tunnel.test", "/ws");
  BOOST_TEST_REQUIRE(!ws.send("before", false));
  std::string echoed;
  BOOST_TEST_REQUIRE(!ws.receive(echoed));
  const auto term = Clock::now();
  gateway.signal(SIGTERM);
  // The tunnel still carries messages during the drain.
  std::this_thread::sleep_for(500ms);
  BOOST_TEST_REQUIRE(!ws.send("during the drain", false));
  BOOST_TEST_REQUIRE(!ws.receive(echoed), gateway.diagnostics());
  BOOST_TEST(echoed == "during the drain");
  const auto ec = ws.receive(echoed);
  const double closed_after = seconds_since(term);
  BOOST_TEST_MESSAGE("tunnel closed " << closed_after << " s after SIGTERM: " << ec.message());
  BOOST_TEST((ec && ec != asio::error::timed_out), ec.message());
  BOOST_TEST(closed_after >= 1.8);
  // SPEC C40: the tunnels close at the end of drain_timeout (spec::kCloseMargin on top).
  const double close_bound =
      std::chrono::duration<double>(kDefaultDrainTimeout + spec::kCloseMargin).count();
  BOOST_TEST(closed_after <= close_bound);  // SPEC C40
  BOOST_TEST(gateway.stop() == 0);
}

// ---------------------------------------------------------------------------------------------
// Held (keyed) requests: timeouts measure progress, not totals (C07)

namespace {

/// Every POST on one keyed route (mode required): the gateway holds request and response.
/// `idempotency`: further entries of the route's idempotency flow mapping (", key: value").
GatewayConfig keyed_config(const StreamUpstream& upstream, const std::string& limits,
                           const std::string& idempotency = "") {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}}};
  config.limits = limits;
  config.routes_yaml =
      "  - name: keyed\n"
      "    match: { path_prefix: / }\n"
      "    upstream: up\n"
      "    idempotency: { mode: required, methods: [POST]" +
      idempotency + " }\n";
  return config;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C07_a_slow_steady_reader_of_a_held_keyed_answer_gets_all_of_it) {
  StreamUpstream upstream;
  Gateway gateway{
      keyed_config(upstream, "{ max_request_body: 1MiB, idle_timeout: 1s, drain_timeout: 2s }")};
  const std::uint64_t n = 24 * kMiB;
  RawClient client(gateway.port(), 30s, static_cast<int>(64 * kKiB));
  BOOST_TEST_REQUIRE(!client.write("POST /bytes?n=" + std::to_string(n) +
                                   " HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " +
                                   unique_name("slow-reader") + "\r\nContent-Length: 0\r\n\r\n"));
  // ~3 s (three times idle_timeout) of reading 1 MiB, then pausing 300 ms: each write of the
  // gateway progresses although the whole answer takes longer than idle_timeout.
  const auto slow_until = Clock::now() + 3s;
  std::uint64_t next_pause = kMiB;
  const Download d = read_download(client, [&](std::uint64_t bytes) {
    if (bytes < next_pause || Clock::now() >= slow_until) return;
    std::this_thread::sleep_for(300ms);
    next_pause = bytes + kMiB;
  });
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.complete, d.describe() << "\n" << gateway.diagnostics());
  BOOST_TEST(d.bytes == n);
  BOOST_TEST(d.pattern_ok);
}

BOOST_AUTO_TEST_CASE(spec_C07_a_slow_steady_upload_of_a_held_keyed_body_is_answered) {
  StreamUpstream upstream;
  Gateway gateway{
      keyed_config(upstream, "{ max_request_body: 8MiB, idle_timeout: 1s, drain_timeout: 2s }")};
  const std::uint64_t n = 4 * kMiB;
  const std::uint64_t piece = 256 * kKiB;
  RawClient client(gateway.port());
  BOOST_TEST_REQUIRE(!client.write(
      "POST /sink HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " +
      unique_name("slow-upload") + "\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n"));
  // 16 pieces 300 ms apart: ~4.5 s in all, each piece well within idle_timeout.
  const auto start = Clock::now();
  for (std::uint64_t sent = 0; sent < n; sent += piece) {
    std::string bytes(piece, '\0');
    for (std::uint64_t i = 0; i < piece; ++i)
      bytes[i] = static_cast<char>(static_cast<unsigned char>((sent + i) % 251));
    BOOST_TEST_REQUIRE(!client.write(bytes),
                       "the gateway cut the upload after " << sent << " bytes");
    std::this_thread::sleep_for(300ms);
  }
  BOOST_TEST_MESSAGE("upload took " << seconds_since(start) << " s");
  const Download d = read_download(client, {}, false);
  BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
  const json::value answer = json::parse(d.text);
  BOOST_TEST(answer.at("bytes").to_number<std::uint64_t>() == n, d.text);
  BOOST_TEST(answer.at("pattern_ok").as_bool(), d.text);
}

BOOST_AUTO_TEST_CASE(spec_C39_a_keyed_answer_past_max_stored_response_is_committed_then_streamed) {
  StreamUpstream upstream;
  GatewayConfig config = keyed_config(upstream, kDefaultLimits, ", max_stored_response: 256KiB");
  // A held answer stops at 1 MiB: a longer one that the gateway tried to hold would be a 502.
  config.upstreams.front().extra = {"max_response_body: 1MiB"};
  Gateway gateway{config};
  // 4 MiB at 2 MiB/s: the upstream needs two seconds for the whole body.
  const std::uint64_t n = 4 * kMiB;
  for (const bool chunked : {false, true}) {
    BOOST_TEST_CONTEXT((chunked ? "chunked" : "Content-Length") << " answer") {
      const std::string target = "/bytes?n=" + std::to_string(n) +
                                 "&rate=" + std::to_string(2 * kMiB) +
                                 (chunked ? "&chunked=1" : "");
      const std::string key = unique_name("c39");
      const HttpRequest request{
          "POST", target, {{"Host", "gateway.test"}, {"Idempotency-Key", key}}, ""};
      const std::uint64_t written_before = upstream.counter("bytes_written_total");
      RawClient client(gateway.port(), kEventDeadline);
      BOOST_TEST_REQUIRE(!client.write(
          "POST " + target + " HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " + key +
          "\r\nContent-Length: 0\r\n\r\n"));
      std::optional<std::uint64_t> written_at_first_bytes;
      std::optional<HttpResponse> retry;
      const Download d = read_download(client, [&](std::uint64_t) {
        if (written_at_first_bytes) return;
        written_at_first_bytes = upstream.counter("bytes_written_total") - written_before;
        // C15: the record is committed before the first byte leaves, so a retry sent now is
        // its replay, not a 409.
        retry = http_request(kLoopback, gateway.port(), request, kEventDeadline);
      });
      BOOST_TEST_REQUIRE(d.status == 200u, d.describe() << "\n" << gateway.diagnostics());
      BOOST_TEST(d.complete, d.describe());
      BOOST_TEST(d.bytes == n);
      BOOST_TEST(d.pattern_ok);
      BOOST_TEST(!d.header("Idempotent-Replayed").has_value(), d.describe());
      BOOST_TEST(!d.header("Idempotent-Body-Omitted").has_value(), d.describe());
      if (chunked) {
        BOOST_TEST(d.header("Transfer-Encoding").value_or("") == "chunked", d.describe());
      } else {
        BOOST_TEST(d.header("Content-Length").value_or("") == std::to_string(n), d.describe());
      }
      // Streamed: the first bytes came while the upstream was still writing the rest.
      BOOST_TEST_REQUIRE(written_at_first_bytes.has_value());
      BOOST_TEST(*written_at_first_bytes < n,
                 "the upstream had written " << *written_at_first_bytes << " of " << n
                                             << " bytes when the first ones reached the client");
      // The record keeps status and fields without the body (C29).
      BOOST_TEST_REQUIRE(retry.has_value());
      BOOST_TEST(retry->status == 200u, gateway.explain(*retry));
      BOOST_TEST(retry->body.empty(), "the replay has " << retry->body.size() << " bytes of body");
      BOOST_TEST(retry->header("Content-Length").value_or("") == "0", describe(*retry));
      BOOST_TEST(retry->header("Idempotent-Replayed").value_or("") == "true", describe(*retry));
      BOOST_TEST(retry->header("Idempotent-Body-Omitted").value_or("") == "true", describe(*retry));
      BOOST_TEST(retry->header("Content-Type").value_or("") == "application/octet-stream",
                 describe(*retry));
    }
  }
  // Each answer was executed once; the retries never reached the upstream.
  BOOST_TEST(upstream.counter("bytes_responses_done") == 2u);
  BOOST_TEST(upstream.counter("bytes_written_total") == 2 * n);
}

// ---------------------------------------------------------------------------------------------
// Full duplex (C47), the 101 rule (C40) and a client that goes away (C48)

namespace {

/// The head of a POST of `length` body bytes to `target`.
std::string upload_head(const std::string& target, std::uint64_t length,
                        const std::string& fields = "") {
  return "POST " + target + " HTTP/1.1\r\nHost: gateway.test\r\n" + fields +
         "Content-Type: application/octet-stream\r\nContent-Length: " + std::to_string(length) +
         "\r\n\r\n";
}

/// Writes pattern bytes [from, to) in 64 KiB pieces; stops at the first failed write.
boost::system::error_code upload_range(RawClient& client, std::uint64_t from, std::uint64_t to) {
  for (std::uint64_t at = from; at < to; at += kPiece) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, to - at));
    if (auto ec = client.write(pattern_text(len, at))) return ec;
  }
  return {};
}

/// The access lines of `gateway` for `target`.
std::vector<json::object> access_lines(const Gateway& gateway, const std::string& target) {
  std::vector<json::object> out;
  for (auto& o : idemgate::test::log_lines(gateway.stderr_text()))
    if (str(o, "msg") == "access" && str(o, "target") == target) out.push_back(std::move(o));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C47_an_early_413_reaches_the_client_while_it_still_uploads) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  const std::uint64_t total = 8 * kMiB;
  for (const std::string then : {"stall", "reset"}) {
    BOOST_TEST_CONTEXT("the upstream answers after 64 KiB, then " << then) {
      RawClient client(gateway.port(), kEventDeadline);
      BOOST_TEST_REQUIRE(
          !client.write(upload_head("/early?after=65536&status=413&then=" + then, total)));
      // The client sends 128 KiB of its 8 MiB and waits for the answer: a gateway that read the
      // response only after the whole request would never give it (kEventDeadline ends it).
      BOOST_TEST_REQUIRE(!upload_range(client, 0, 128 * kKiB));
      const Download d = read_download(client, {}, false);
      BOOST_TEST_REQUIRE(d.status == 413u, d.describe() << "\n" << gateway.diagnostics());
      BOOST_TEST(d.complete, d.describe());
      BOOST_TEST(d.text == "early answer\n", d.describe());
      BOOST_TEST(d.header("Connection").value_or("") == "close", d.describe());
      // The rest of the body is not read: the connection closes after the answer, which the
      // client sees as a failed write or, once all is written, as the end of the connection.
      const auto wec = upload_range(client, 128 * kKiB, total);
      BOOST_TEST((!wec || closed_by_peer(wec)), wec.message());
      char byte = 0;
      std::size_t got = 0;
      const auto ec = client.read_some(&byte, 1, got);
      BOOST_TEST(closed_by_peer(ec), "the connection stayed open: " << ec.message());
    }
  }
  BOOST_TEST(upstream.counter("early_answers") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C47_a_response_streams_to_the_client_while_the_upload_goes_on) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  const std::uint64_t total = 2 * kMiB;
  RawClient client(gateway.port(), kEventDeadline);
  BOOST_TEST_REQUIRE(!client.write(upload_head("/duplex", total)));
  BOOST_TEST_REQUIRE(!upload_range(client, 0, kPiece));
  // The upstream answers each piece it reads; the client sends no more before it has the
  // answer's first bytes (kEventDeadline ends a gateway that holds them back).
  BOOST_TEST_REQUIRE(!client.read_header(), gateway.diagnostics());
  BOOST_TEST_REQUIRE(client.parser().get().result_int() == 200u);
  std::string text(256, '\0');
  std::size_t got = 0;
  while (got == 0) {
    BOOST_TEST_REQUIRE(!client.read_body(text.data(), text.size(), got, true),
                       gateway.diagnostics());
  }
  text.resize(got);
  BOOST_TEST_MESSAGE("first bytes of the answer during the upload: " << text);
  BOOST_TEST_REQUIRE(!upload_range(client, kPiece, total));
  std::string piece(4096, '\0');
  while (!client.parser().is_done()) {
    const auto ec = client.read_body(piece.data(), piece.size(), got, true);
    BOOST_TEST_REQUIRE(!ec, ec.message() << "\n" << gateway.diagnostics());
    text.append(piece.data(), got);
  }
  // One line per piece the upstream read, the last one the whole body.
  BOOST_TEST(text.ends_with("\n" + std::to_string(total) + "\n"), text.substr(0, 2000));
  BOOST_TEST(upstream.counter("duplex_done") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C47_a_keyed_early_413_is_relayed_committed_and_replayed) {
  StreamUpstream upstream;
  Gateway gateway{keyed_config(upstream, "{ max_request_body: 16MiB, drain_timeout: 2s }")};
  const std::string body = pattern_text(8 * kMiB);
  for (const std::string then : {"stall", "reset"}) {
    BOOST_TEST_CONTEXT("the upstream answers after 64 KiB, then " << then) {
      const HttpRequest request{
          "POST",
          "/early?after=65536&status=413&then=" + then,
          {{"Host", "gateway.test"}, {"Idempotency-Key", unique_name("early-" + then)}},
          body};
      const HttpResponse first = http_request(kLoopback, gateway.port(), request, kEventDeadline);
      BOOST_TEST(first.status == 413u, gateway.explain(first));
      BOOST_TEST(first.body == "early answer\n");
      BOOST_TEST(!first.header("Idempotent-Replayed").has_value(), describe(first));
      // Stored like any answer whose status is storable (C15, C21): the retry is its replay.
      const HttpResponse replay = http_request(kLoopback, gateway.port(), request, kEventDeadline);
      BOOST_TEST(replay.status == 413u, gateway.explain(replay));
      BOOST_TEST(replay.body == "early answer\n");
      BOOST_TEST(replay.header("Idempotent-Replayed").value_or("") == "true", describe(replay));
    }
  }
  BOOST_TEST(upstream.counter("early_requests") == 2u);
}

BOOST_AUTO_TEST_CASE(spec_C40_a_101_that_does_not_switch_to_the_requested_protocol_is_502) {
  StreamUpstream upstream;
  Gateway gateway{stream_config(upstream, kDefaultLimits, true)};
  const HeaderList upgrade = websocket_upgrade("tunnel.test");
  // A 101 naming another protocol, and one naming none (RFC 9110 §7.8).
  for (const std::string answer : {"h2c", ""}) {
    BOOST_TEST_CONTEXT("101 with Upgrade '" << answer << "'") {
      HttpConnection connection(kLoopback, gateway.port(), kEventDeadline);
      const HttpResponse res =
          connection.request({"GET", "/bad-upgrade?upgrade=" + answer, upgrade, ""});
      BOOST_TEST(is_problem(res, 502), gateway.explain(res));
      BOOST_TEST(!res.header("Upgrade").has_value(), describe(res));
    }
  }
  BOOST_TEST(upstream.counter("bad_upgrades") == 2u);
  BOOST_TEST(eventually([&] {
               std::size_t refused = 0;
               for (const auto& prefix : {"/bad-upgrade?upgrade=h2c", "/bad-upgrade?upgrade="})
                 for (const auto& line : access_lines(gateway, prefix))
                   if (str(line, "outcome") == "upstream_error") ++refused;
               return refused == 2;
             }),
             gateway.diagnostics());
}

BOOST_AUTO_TEST_CASE(spec_C48_a_client_that_leaves_closes_the_upstream_connection_within_1s) {
  StreamUpstream upstream;
  GatewayConfig config = stream_config(upstream, kDefaultLimits);
  // A gateway that kept the upstream connection until a timeout would keep it a minute.
  config.upstreams.front().request_timeout = "60s";
  config.upstreams.front().extra = {"idle_timeout: 60s"};
  Gateway gateway{config};
  std::uint64_t closed = 0;
  for (const bool reset : {false, true}) {
    // While the event stream is open and quiet, and while the client waits for its header.
    for (const bool streaming : {true, false}) {
      BOOST_TEST_CONTEXT("the client " << (reset ? "resets" : "closes") << " while "
                                       << (streaming ? "the stream is open" : "it waits")) {
        RawClient client(gateway.port(), kEventDeadline);
        BOOST_TEST_REQUIRE(!client.write(get_request(streaming ? "/sse" : "/sse?head=0")));
        if (streaming) {
          BOOST_TEST_REQUIRE(!client.read_header(), gateway.diagnostics());
          BOOST_TEST_REQUIRE(client.parser().get().result_int() == 200u);
          char event[64];
          std::size_t got = 0;
          while (got == 0) BOOST_TEST_REQUIRE(!client.read_body(event, sizeof event, got, true));
          BOOST_TEST(std::string_view(event, got) == "data: hello\n\n");
        } else {
          BOOST_TEST_REQUIRE(upstream.wait_for_counter("sse_open", 1), gateway.diagnostics());
        }
        const auto left = Clock::now();
        client.close(reset);
        ++closed;
        BOOST_TEST_REQUIRE(upstream.wait_for_counter("sse_closed", closed),
                           "the upstream connection stayed open\n"
                               << gateway.diagnostics());
        const auto after = Clock::now() - left;
        BOOST_TEST_MESSAGE("upstream connection closed "
                           << std::chrono::duration<double>(after).count()
                           << " s after the client left");
        BOOST_TEST((after <= spec::kUpstreamCloseAfterClient + spec::kCloseMargin));  // SPEC C48
      }
    }
  }
  // Each access line says the client closed.
  BOOST_TEST(eventually([&] {
               std::size_t said = 0;
               for (const std::string target : {"/sse", "/sse?head=0"})
                 for (const auto& line : access_lines(gateway, target))
                   if (str(line, "ended") == "client_closed") ++said;
               return said == 4;
             }),
             gateway.diagnostics());
}

BOOST_AUTO_TEST_SUITE_END()

// SPEC C50: an HTTP/2 upload on a route without the contract streams like C38: past
// max_request_body, with and without a content-length (chunked to the upstream), the
// gateway's RSS bounded. curl sends the body from a file of the upstream's pattern.
BOOST_AUTO_TEST_CASE(spec_C50_an_h2_upload_streams_with_bounded_gateway_rss) {
  StreamUpstream upstream;
  const SmallAsanQuarantine quarantine;
  Gateway gateway{stream_config(upstream, kDefaultLimits)};
  constexpr std::uint64_t kSize =
      64 * kMiB;  // twice the RSS budget, within kEventDeadline under TSan
  const auto file = (gateway.dir() / "upload.bin").string();
  {
    std::ofstream out(file, std::ios::binary);
    std::string piece(kPiece, '\0');
    for (std::uint64_t at = 0; at < kSize; at += kPiece) {
      fill_pattern(piece.data(), piece.size(), at);
      out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
    }
  }
  const auto url = "http://127.0.0.1:" + std::to_string(gateway.port()) + "/sink";
  const auto upload = [&](bool chunked) {
    std::vector<std::string> args = {
        "-s", "--http2-prior-knowledge", "-w", "\n%{http_version}", "--data-binary", "@" + file};
    if (chunked) args.insert(args.end(), {"-H", "Content-Length:"});  // END_STREAM frames it
    args.push_back(url);
    return run_program("/usr/bin/curl", args, gateway.dir());
  };
  BOOST_TEST_REQUIRE(upload(false).status == 0);  // warm-up: pools, buffers
  RssSampler rss(gateway.pid());
  std::this_thread::sleep_for(200ms);
  const std::uint64_t idle = rss.rss();
  for (const bool chunked : {false, true}) {
    BOOST_TEST_CONTEXT((chunked ? "without" : "with") << " content-length") {
      const auto start = Clock::now();
      const CliResult run = upload(chunked);
      BOOST_TEST_MESSAGE("h2 upload of " << kSize / kMiB << " MiB: " << seconds_since(start)
                                         << " s, gateway RSS idle " << idle / kKiB << " KiB, max "
                                         << rss.max() / kKiB << " KiB");
      BOOST_TEST_REQUIRE(run.status == 0, run.err);
      const auto nl = run.out.rfind('\n');
      BOOST_TEST_REQUIRE(nl != std::string::npos, run.out);
      BOOST_TEST(run.out.substr(nl + 1) == "2");
      const json::value answer = json::parse(run.out.substr(0, nl));
      BOOST_TEST(answer.at("bytes").to_number<std::uint64_t>() == kSize, run.out);
      BOOST_TEST(answer.at("pattern_ok").as_bool(), run.out);
    }
  }
  BOOST_TEST(upstream.counter("sink_bytes_total") == 3 * kSize);
  BOOST_TEST(rss.max() - std::min(rss.max(), idle) < kRssBudget, "the gateway's RSS grew from "
                                                                     << idle / kKiB << " KiB to "
                                                                     << rss.max() / kKiB << " KiB");
}
