// HTTP/2 frames no well-behaved client sends (SPEC C49 stream errors, C50 stream limits and
// resets, C51 hostile HTTP/2), written by hand with tests/support/h2_frames against a real
// idemgate in front of the in-test upstream. Each attack asserts what C51 asks: the offending
// connection gets GOAWAY (or is closed), the gateway's RSS stays within 64 MiB of what it was
// before, another client keeps getting answers, and no keyed request executes twice.
#define BOOST_TEST_MODULE h2_attacks_e2e
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "tests/contract/contract_support.hpp"
#include "tests/support/h2_frames.hpp"
#include "tests/support/metric_text.hpp"
#include "tests/support/process_memory.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;
using namespace std::chrono_literals;
namespace h2 = idemgate::test::h2;

// SPEC C51: within 64 MiB of idle (what that is in RSS depends on the build: rss_allowance).
constexpr std::uint64_t kRssAllowance = idemgate::test::rss_allowance(64ull * 1024 * 1024);
constexpr auto kAttackTime = 10s;  // the issue's "for 10 s"

struct AttackFixture {
  const SmallAsanQuarantine quarantine;  // RSS measures what the gateway holds (see its doc)
  TestUpstream upstream;
  std::string keyed = unique_route("h2_attacked");
  Gateway gateway{h2_gateway_config(upstream, keyed,
                                    "{ max_request_body: 64KiB, max_header_bytes: 4KiB, "
                                    "idle_timeout: 2s, h2_max_concurrent_streams: 100, "
                                    "drain_timeout: 2s }")};

  /// A well-behaved HTTP/1.1 request on another connection is answered.
  void others_are_answered(const std::string& what) {
    const HttpResponse res = gateway.send({"GET", "/other", {}, ""});
    BOOST_TEST(res.status == 201u, what << ": " << gateway.explain(res));
  }

  /// Runs `attack` (which sends on `c` until it returns false or kAttackTime passes), then
  /// checks C51's common points and returns how the connection ended.
  h2::Ending run(const std::string& what, const std::function<bool(h2::Connection&)>& attack) {
    RssSampler rss(gateway.pid());
    const std::uint64_t before = rss.rss();
    h2::Connection c(gateway.port());
    c.send(h2::preface());
    const auto until = std::chrono::steady_clock::now() + kAttackTime;
    while (std::chrono::steady_clock::now() < until && attack(c)) {
    }
    const h2::Ending ending = c.read_until_goaway(5s);
    BOOST_TEST_MESSAGE(what << ": goaway " << (ending.goaway ? std::to_string(*ending.goaway) : "-")
                            << ", closed " << ending.closed << ", RSS " << before << " → max "
                            << rss.max());
    BOOST_TEST(rss.max() <= before + kRssAllowance, what << ": RSS grew by " << rss.max() - before);
    others_are_answered(what);
    return ending;
  }
};

std::string big_value(std::size_t n) {
  return std::string(n, 'v');
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(h2_attacks, AttackFixture)

BOOST_AUTO_TEST_CASE(spec_C49_connection_specific_fields_and_a_false_length_are_stream_errors) {
  h2::Connection c(gateway.port());
  BOOST_TEST_REQUIRE(c.send(h2::preface()));
  std::uint32_t id = 1;
  for (const auto& field : h2::Fields{{"connection", "keep-alive"},
                                      {"transfer-encoding", "chunked"},
                                      {"te", "gzip"},
                                      {"upgrade", "websocket"},
                                      {"keep-alive", "timeout=5"},
                                      {"proxy-connection", "close"}}) {
    BOOST_TEST_CONTEXT(field.first) {
      c.send(h2::headers(id, h2::request_fields("GET", "/specific", {field}), true));
      const auto rst = c.read_until(h2::kRstStream, id, 5s);
      BOOST_TEST_REQUIRE(rst.has_value(), gateway.diagnostics());
      BOOST_TEST(rst->error_code() == h2::kProtocolError);
    }
    id += 2;
  }
  // content-length that the DATA does not match (RFC 9113 §8.1.1).
  c.send(
      h2::headers(id, h2::request_fields("POST", "/specific", {{"content-length", "10"}}), false));
  c.send(h2::data(id, "abc", true));
  const auto rst = c.read_until(h2::kRstStream, id, 5s);
  BOOST_TEST_REQUIRE(rst.has_value());
  BOOST_TEST(rst->error_code() == h2::kProtocolError);
  // `te: trailers` is allowed, and the connection still serves.
  id += 2;
  c.send(h2::headers(id, h2::request_fields("GET", "/specific", {{"te", "trailers"}}), true));
  const auto answer = c.read_until(h2::kHeaders, id, 5s);
  BOOST_TEST(answer.has_value());
  BOOST_TEST(upstream.count("/specific") == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C50_streams_past_the_limit_are_refused_not_queued) {
  UpstreamReply held;
  held.hold = true;
  upstream.on("/held", {held});
  h2::Connection c(gateway.port());
  c.send(h2::preface());
  // Sent before the gateway's SETTINGS are acknowledged: a client that has not seen the limit
  // yet gets REFUSED_STREAM for the streams past it (RFC 9113 §5.1.2, §8.7: safe to retry). One
  // that exceeds an acknowledged limit breaks the protocol: libnghttp2 then ends the connection
  // with GOAWAY PROTOCOL_ERROR (conf/REFERENCE.md, "HTTP/2").
  std::string burst;
  for (std::uint32_t i = 0; i < 101; ++i) {
    burst += h2::headers(2 * i + 1, h2::request_fields("GET", "/held"), true);
  }
  c.send(burst);
  const auto refused = c.read_until(h2::kRstStream, 201, 10s);
  BOOST_TEST_REQUIRE(refused.has_value(), gateway.diagnostics());
  BOOST_TEST(refused->error_code() == h2::kRefusedStream);
  BOOST_TEST(upstream.wait_for("/held", 100));
  upstream.release();
  // The hundred admitted streams are answered.
  std::size_t answered = 0;
  while (answered < 100) {
    const auto f = c.read(10s);
    if (!f) break;
    if (f->type == h2::kHeaders) ++answered;
  }
  BOOST_TEST(answered == 100u);
  BOOST_TEST(upstream.count("/held") == 100u);
}

BOOST_AUTO_TEST_CASE(spec_C50_a_keyed_stream_reset_before_its_end_reaches_no_upstream) {
  const std::string body = R"({"amount":"4.00"})";
  {
    h2::Connection c(gateway.port());
    c.send(h2::preface());
    c.send(h2::headers(1,
                       h2::request_fields("POST", "/pay/reset",
                                          {{"content-type", "application/json"},
                                           {"idempotency-key", "h2-reset-early"},
                                           {"content-length", std::to_string(body.size())}}),
                       false));
    c.send(h2::data(1, body.substr(0, 5), false));
    c.send(h2::rst_stream(1, h2::kCancel));
    // The connection goes on: a ping is answered after the reset was read.
    c.send(h2::ping(7));
    BOOST_TEST(c.read_until(h2::kPing, 0, 5s).has_value());
  }
  BOOST_TEST(upstream.count("/pay/reset") == 0u);
  // No lock was taken: the same key executes at once, not 409.
  const HttpResponse res = gateway.send(keyed_post("/pay/reset", "h2-reset-early", body));
  BOOST_TEST(res.status == 201u, gateway.explain(res));
  BOOST_TEST(upstream.count("/pay/reset") == 1u);
}

BOOST_AUTO_TEST_CASE(
    spec_C50_a_streamed_upload_reset_midway_leaves_the_upstream_request_unfinished) {
  // No content-length on a route without the contract: the body streams to the upstream
  // (chunked) as it comes; a reset midway cuts the upstream request, which never completes.
  h2::Connection c(gateway.port());
  c.send(h2::preface());
  c.send(h2::headers(1, h2::request_fields("POST", "/stream-reset"), false));
  c.send(h2::data(1, std::string(5000, 's'), false));
  std::this_thread::sleep_for(200ms);  // the upstream request has begun
  c.send(h2::rst_stream(1, h2::kCancel));
  c.send(h2::ping(9));
  BOOST_TEST(c.read_until(h2::kPing, 0, 5s).has_value());
  // The next stream on the same connection streams and completes.
  c.send(h2::headers(3, h2::request_fields("POST", "/stream-after"), false));
  c.send(h2::data(3, "whole", true));
  const auto answer = c.read_until(h2::kHeaders, 3, 10s);
  BOOST_TEST(answer.has_value(), gateway.diagnostics());
  BOOST_TEST(upstream.wait_for("/stream-after", 1));
  BOOST_TEST(upstream.received("/stream-after").at(0).body == "whole");
  BOOST_TEST(upstream.count("/stream-reset") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C51_rapid_reset_ends_the_connection_and_executes_nothing_twice) {
  std::uint32_t id = 1;
  const auto ending = run("rapid reset", [&](h2::Connection& c) {
    std::string batch;
    for (int i = 0; i < 50; ++i, id += 2) {
      // Keyed and plain streams alike, opened and reset at once.
      if (i % 2 == 0) {
        batch += h2::headers(id, h2::request_fields("GET", "/rr"), true);
      } else {
        const std::string key = "rr-" + std::to_string(id);
        batch += h2::headers(
            id,
            h2::request_fields("POST", "/pay/rr",
                               {{"content-type", "application/json"}, {"idempotency-key", key}}),
            false);
        batch += h2::data(id, "{}", true);
      }
      batch += h2::rst_stream(id, h2::kCancel);
    }
    return c.send(batch) && !c.closed();
  });
  // Ours (streams in progress past the limit, or the RST_STREAM budget) or libnghttp2's own
  // reset rate limit, whichever comes first: GOAWAY either way (C51).
  BOOST_TEST_REQUIRE(ending.goaway.has_value(), gateway.diagnostics());
  BOOST_TEST((*ending.goaway == h2::kEnhanceYourCalm || *ending.goaway == 2u), *ending.goaway);
  // Every keyed request that reached the upstream did so once (its key is unique to it): the
  // upstream saw no key twice.
  std::set<std::string> keys;
  for (const auto& r : upstream.received("/pay/rr")) {
    const auto key = r.value("Idempotency-Key").value_or("");
    BOOST_TEST(keys.insert(key).second, "key " << key << " executed twice");
  }
}

BOOST_AUTO_TEST_CASE(spec_C51_continuation_flood_ends_the_connection) {
  bool first = true;
  const auto ending = run("continuation flood", [&](h2::Connection& c) {
    std::string batch;
    if (first) {
      batch = h2::frame(h2::kHeaders, 0, 1,
                        h2::header_block(h2::request_fields("GET", "/cont")));  // no END_HEADERS
      first = false;
    }
    for (int i = 0; i < 100; ++i) {
      batch += h2::frame(h2::kContinuation, 0, 1,
                         h2::header_block({{"x-more-" + std::to_string(i), big_value(100)}}));
    }
    return c.send(batch) && !c.closed();
  });
  // C51: closed with GOAWAY, whichever bound it passed first (libnghttp2's count of
  // CONTINUATION frames, or ours of the header list's size).
  BOOST_TEST_REQUIRE(ending.goaway.has_value(), gateway.diagnostics());
  BOOST_TEST(*ending.goaway == h2::kEnhanceYourCalm, *ending.goaway);
  BOOST_TEST(upstream.count("/cont") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C51_hpack_bomb_ends_the_connection) {
  const auto ending = run("HPACK bomb", [&](h2::Connection& c) {
    // One 4000-byte field into the dynamic table (literal with incremental indexing, index 62),
    // then referenced 10 000 times: a 10 KB block that decodes to 40 MB.
    std::string block = h2::header_block(h2::request_fields("GET", "/bomb"));
    block.push_back(0x40);
    block += h2::header_block({{"x-bomb", big_value(4000)}}).substr(1);
    block.append(10'000, static_cast<char>(0x80 | 62));
    c.send(h2::frame(h2::kHeaders, h2::kEndHeaders | h2::kEndStream, 1, block));
    return false;
  });
  BOOST_TEST_REQUIRE(ending.goaway.has_value(), gateway.diagnostics());
  BOOST_TEST(*ending.goaway == h2::kEnhanceYourCalm);
  BOOST_TEST(upstream.count("/bomb") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C51_control_frame_floods_end_the_connection) {
  const std::vector<std::pair<std::string, std::string>> floods = {
      {"PING flood", h2::ping(1)},
      {"SETTINGS flood", h2::frame(h2::kSettings, 0, 0, "")},
      {"PRIORITY flood", h2::priority(3, 0, 16)},
      {"RST_STREAM flood", h2::rst_stream(1, h2::kCancel)},  // stream 1 is closed by then
      {"empty DATA flood", std::string()},
      {"padded empty DATA flood",
       h2::frame(h2::kData, 0x8, 1, std::string(1, '\x05') + std::string(5, '\0'))},
      {"unknown frame type flood", h2::frame(0xfa, 0, 0, "x")},
      {"one-byte WINDOW_UPDATE flood",
       h2::frame(h2::kWindowUpdate, 0, 0, std::string("\0\0\0\1", 4))},
  };
  for (const auto& [what, one] : floods) {
    BOOST_TEST_CONTEXT(what) {
      bool opened = false;
      const auto ending = run(what, [&](h2::Connection& c) {
        std::string batch;
        const bool data_flood = one.empty() || what == "padded empty DATA flood";
        if (!opened) {  // stream 1: open for the DATA floods, answered and closed for the rest
          batch = h2::headers(1, h2::request_fields("POST", "/flood"), !data_flood);
          opened = true;
        }
        for (int i = 0; i < 200; ++i) batch += one.empty() ? h2::data(1, "", false) : one;
        return c.send(batch) && !c.closed();
      });
      BOOST_TEST_REQUIRE(ending.goaway.has_value(), gateway.diagnostics());
      BOOST_TEST(*ending.goaway == h2::kEnhanceYourCalm);
    }
  }
  // Counted for operators, by reason (C51).
  const std::string metrics = gateway.admin_get("/metrics").body;
  BOOST_TEST(metric_value(metrics, "idemgate_h2_connections_ended_total", {{"reason", "flood"}})
                     .value_or(0) == static_cast<double>(floods.size()),
             metrics);
}

BOOST_AUTO_TEST_CASE(spec_C51_bodies_begun_on_every_stream_hold_bounded_memory_and_time_out) {
  const auto ending = run("bodies on every stream", [&](h2::Connection& c) {
    std::string batch;
    for (std::uint32_t id = 1; id <= 199; id += 2) {
      batch += h2::headers(
          id,
          h2::request_fields("POST", "/never-ends", {{"content-length", std::to_string(60'000)}}),
          false);
    }
    c.send(batch);
    // As much of each body as the windows let through; none ends.
    const std::string piece(16 * 1024, 'b');
    for (int round = 0; round < 4; ++round) {
      for (std::uint32_t id = 1; id <= 199; id += 2) {
        if (!c.send(h2::data(id, piece, false))) return false;
      }
    }
    return false;
  });
  // Nothing was forwarded, and the connection was ended once it stopped sending (C07).
  BOOST_TEST((ending.goaway.has_value() || ending.closed), gateway.diagnostics());
  BOOST_TEST(upstream.count("/never-ends") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C51_a_peer_that_reads_nothing_is_cut_after_idle_timeout) {
  // 4 MiB pass-through answers on 25 streams: held whole they would be 100 MiB; each stream
  // holds at most stream_buffer of its answer (C38).
  std::string big;
  while (big.size() < 4 * 1024 * 1024) big += "0123456789";
  upstream.on("/zero", {{200, {{"Content-Type", "text/plain"}}, big}});
  RssSampler rss(gateway.pid());
  const std::uint64_t before = rss.rss();
  h2::Connection c(gateway.port());
  // A zero initial window: the answers' headers come, their bodies never may.
  c.send(h2::preface({{0x4, 0}}));
  std::string requests;
  for (std::uint32_t id = 1; id <= 49; id += 2) {
    requests += h2::headers(id, h2::request_fields("GET", "/zero"), true);
  }
  c.send(requests);
  const auto started = std::chrono::steady_clock::now();
  // Closed after idle_timeout (2s); the wait is only a guard against a hang.
  const h2::Ending ending =
      c.read_until_goaway(std::chrono::duration_cast<std::chrono::milliseconds>(kEventDeadline));
  BOOST_TEST(ending.closed, "the connection was not closed");
  BOOST_TEST_MESSAGE(
      "zero window: closed after "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  BOOST_TEST(rss.max() <= before + kRssAllowance, "RSS grew by " << rss.max() - before);
  others_are_answered("zero window");
  // Every cut stream has its access line, not written (C32).
  BOOST_TEST(eventually([&] {
               const std::string log = gateway.stderr_text();
               std::size_t lines = 0;
               for (auto at = log.find("\"target\":\"/zero\""); at != std::string::npos;
                    at = log.find("\"target\":\"/zero\"", at + 1))
                 ++lines;
               return lines == 25;
             }),
             gateway.diagnostics());
}

BOOST_AUTO_TEST_CASE(spec_C51_a_client_that_cancels_a_stream_and_opens_another_keeps_going) {
  UpstreamReply held;
  held.hold = true;
  upstream.on("/busy", {held});
  h2::Connection c(gateway.port());
  c.send(h2::preface());
  c.read_until(h2::kSettings, 0, 5s);
  std::string burst;
  for (std::uint32_t id = 1; id <= 199; id += 2)
    burst += h2::headers(id, h2::request_fields("GET", "/busy"), true);
  c.send(burst);
  BOOST_TEST_REQUIRE(upstream.wait_for("/busy", 100), gateway.diagnostics());
  // One cancelled (its handler still waits on the upstream), one opened in its place.
  c.send(h2::rst_stream(1, h2::kCancel) +
         h2::headers(201, h2::request_fields("GET", "/busy"), true));
  BOOST_TEST(upstream.wait_for("/busy", 101), gateway.diagnostics());
  upstream.release();
  std::size_t answered = 0;
  bool goaway = false;
  while (answered < 100) {
    const auto f = c.read(10s);
    if (!f) break;
    if (f->type == h2::kHeaders) ++answered;
    if (f->type == h2::kGoaway) goaway = true;
  }
  BOOST_TEST(!goaway);
  BOOST_TEST(answered == 100u);
}

BOOST_AUTO_TEST_CASE(spec_C51_a_body_that_stops_arriving_is_reset_after_idle_timeout) {
  h2::Connection c(gateway.port());
  c.send(h2::preface());
  c.send(
      h2::headers(1, h2::request_fields("POST", "/stalled", {{"content-length", "100"}}), false));
  c.send(h2::data(1, "{\"a\":", false));
  // The connection stays busy (PINGs, within their budget); the stream does not.
  std::optional<h2::Frame> reset;
  const auto until = std::chrono::steady_clock::now() + kEventDeadline;
  while (!reset && std::chrono::steady_clock::now() < until) {
    c.send(h2::ping(3));
    reset = c.read_until(h2::kRstStream, 1, 500ms);
  }
  BOOST_TEST_REQUIRE(reset.has_value(), gateway.diagnostics());
  BOOST_TEST(reset->error_code() == h2::kCancel);
  BOOST_TEST(upstream.count("/stalled") == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
