// The HTTP/2 codec without sockets (SPEC C49–C51): frames built by hand go in, the frames the
// codec answers with are read back, and its events are recorded.
#define BOOST_TEST_MODULE h2_codec
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/http/h2_codec.hpp"
#include "gateway/http/problem.hpp"
#include "tests/support/h2_frames.hpp"

namespace bhttp = boost::beast::http;
namespace http = idemgate::http;
namespace h2 = idemgate::test::h2;

namespace {

/// A codec with small limits, the events it reported and the frames it sent.
struct Harness final : http::H2Events {
  explicit Harness(std::size_t max_streams = 100, std::size_t max_body = 4096,
                   std::size_t max_header = 1024) {
    auto cfg = std::make_shared<http::ProxyConfig>();
    cfg->limits.h2_max_concurrent_streams = max_streams;
    cfg->limits.max_request_body = max_body;
    cfg->limits.max_header_bytes = max_header;
    snapshot = cfg;
    codec.emplace([cfg] { return cfg; }, *this);
  }

  std::shared_ptr<const http::ProxyConfig> snapshot;
  std::optional<http::H2Codec> codec;
  std::vector<std::shared_ptr<http::H2Stream>> ready;
  std::vector<std::int32_t> closed;
  std::vector<std::string> calmed_reasons;
  std::size_t pieces_taken = 0;
  bool stream_bodies = false;
  std::size_t bodies_arrived = 0;
  std::string out;  ///< sent by the codec, not yet read as frames

  void request_ready(std::shared_ptr<http::H2Stream> s) override { ready.push_back(std::move(s)); }
  void stream_closed(http::H2Stream& s) override { closed.push_back(s.id); }
  void piece_taken(http::H2Stream&) override { ++pieces_taken; }
  void calmed(std::string_view reason, std::string_view) override {
    calmed_reasons.emplace_back(reason);
  }
  void wants_write() override {}
  bool streams_body(http::H2Stream&) override { return stream_bodies; }
  void body_arrived(http::H2Stream&) override { ++bodies_arrived; }

  /// Feeds the client's bytes; what receive() said.
  bool feed(const std::string& bytes) { return codec->receive(bytes.data(), bytes.size()); }
  /// Everything the codec has to send now, as frames.
  std::vector<h2::Frame> frames() {
    std::string batch;
    while (codec->send(batch, 1 << 20)) {
      if (batch.empty()) break;
      out += batch;
      batch.clear();
      codec->wrote();
    }
    std::vector<h2::Frame> got;
    while (auto f = h2::take_frame(out)) got.push_back(std::move(*f));
    return got;
  }
  /// The first frame of `type` on `stream` among `frames` (nullopt when none).
  static std::optional<h2::Frame> find(const std::vector<h2::Frame>& frames, std::uint8_t type,
                                       std::uint32_t stream) {
    for (const auto& f : frames) {
      if (f.type == type && f.stream == stream) return f;
    }
    return std::nullopt;
  }
  /// Opens the connection: preface, empty SETTINGS, and the ACK of the codec's SETTINGS.
  void open() {
    BOOST_TEST_REQUIRE(feed(h2::preface()));
    BOOST_TEST_REQUIRE(feed(h2::frame(h2::kSettings, h2::kAck, 0, "")));
    frames();
  }
  /// Answers `s` 200 with `body` held whole, as the connection does, and ends its handler.
  void answer(http::H2Stream& s, const std::string& body) {
    http::Response res{bhttp::status::ok, 11};
    res.body() = body;
    res.prepare_payload();
    codec->submit(s, res, false, false);
    codec->finished(s);
  }
};

std::uint32_t goaway_last_stream(const h2::Frame& f) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(f.payload.at(i)); };
  return ((b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3)) & 0x7fffffffU;
}

h2::Fields with_length(std::size_t n) {
  return {{"content-length", std::to_string(n)}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C49_a_stream_is_one_request_with_authority_as_host_and_cookies_joined) {
  Harness h;
  h.open();
  BOOST_TEST(h.feed(h2::headers(
      1,
      h2::request_fields("GET", "/orders?id=7",
                         {{"cookie", "a=1"}, {"accept", "text/plain"}, {"cookie", "b=2"}}),
      true)));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);
  http::H2Stream& s = *h.ready[0];
  BOOST_TEST(!http::assemble_request(s).has_value());
  BOOST_TEST(s.request.method_string() == "GET");
  BOOST_TEST(s.request.target() == "/orders?id=7");
  BOOST_TEST(s.request[bhttp::field::host] == h2::request_fields("GET", "/")[3].second);
  BOOST_TEST(s.request[bhttp::field::cookie] == "a=1; b=2");
  BOOST_TEST(s.request[bhttp::field::accept] == "text/plain");
  BOOST_TEST(h.codec->running() == 1u);

  h.answer(s, "hello");
  const auto frames = h.frames();
  BOOST_TEST(Harness::find(frames, h2::kHeaders, 1).has_value());
  const auto data = Harness::find(frames, h2::kData, 1);
  BOOST_TEST_REQUIRE(data.has_value());
  BOOST_TEST(data->payload == "hello");
  BOOST_TEST((data->flags & h2::kEndStream) != 0);
  BOOST_TEST(h.codec->running() == 0u);
  BOOST_TEST(h.closed == std::vector<std::int32_t>{1});
  BOOST_TEST(s.close_error == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C50_a_header_list_past_max_header_bytes_is_answered_431_at_once) {
  Harness h(100, 4096, 256);
  h.open();
  // No END_STREAM: the request is answered without waiting for its body.
  h.feed(h2::headers(1, h2::request_fields("POST", "/big", {{"x-pad", std::string(300, 'p')}}),
                     false));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);
  const auto reject = http::assemble_request(*h.ready[0]);
  BOOST_TEST_REQUIRE(reject.has_value());
  BOOST_TEST((reject->problem == http::Problem::headers_too_large));
  BOOST_TEST(h.calmed_reasons.empty());
}

BOOST_AUTO_TEST_CASE(spec_C04_a_body_past_max_request_body_is_answered_413_before_it_ends) {
  Harness h(100, 1000);
  h.open();
  h.feed(h2::headers(1, h2::request_fields("POST", "/upload"), false));
  h.feed(h2::data(1, std::string(800, 'a'), false));
  BOOST_TEST(h.ready.empty());
  h.feed(h2::data(1, std::string(800, 'b'), false));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);
  const auto reject = http::assemble_request(*h.ready[0]);
  BOOST_TEST_REQUIRE(reject.has_value());
  BOOST_TEST((reject->problem == http::Problem::payload_too_large));
  BOOST_TEST(h.ready[0]->request.body().size() <= 1000u);
}

BOOST_AUTO_TEST_CASE(spec_C50_bodies_are_admitted_oldest_first_within_four_max_request_bodies) {
  Harness h(100, 4096);
  h.open();
  for (std::uint32_t id = 1; id <= 9; id += 2) {
    h.feed(h2::headers(id, h2::request_fields("POST", "/up", with_length(4096)), false));
    h.feed(h2::data(id, std::string(100, 'x'), false));
  }
  const auto& streams = h.codec->streams();
  BOOST_TEST(h.codec->held_bodies() == 4 * 4096u);
  for (std::int32_t id = 1; id <= 7; id += 2) BOOST_TEST(streams.at(id)->admitted, id);
  BOOST_TEST(!streams.at(9)->admitted);
  BOOST_TEST(streams.at(9)->waiting);
  // The oldest body is cancelled by its client: its reservation goes to the next in line.
  h.feed(h2::rst_stream(1, h2::kCancel));
  BOOST_TEST(streams.count(1) == 0u);
  BOOST_TEST(streams.at(9)->admitted);
  BOOST_TEST(h.codec->held_bodies() == 4 * 4096u);
}

BOOST_AUTO_TEST_CASE(spec_C07_a_body_that_stops_arriving_is_reset_with_cancel) {
  Harness h;
  h.open();
  h.feed(h2::headers(1, h2::request_fields("POST", "/slow", with_length(1000)), false));
  h.feed(h2::data(1, "part", false));
  h.feed(h2::headers(3, h2::request_fields("GET", "/quick"), true));
  h.frames();
  const auto now = http::H2Codec::Clock::now();
  BOOST_TEST(h.codec->reset_stalled(now, std::chrono::hours(1)) == 0u);
  // Stream 3 is being answered: only the stalled body is reset.
  BOOST_TEST(h.codec->reset_stalled(now + std::chrono::hours(2), std::chrono::hours(1)) == 1u);
  const auto frames = h.frames();
  const auto rst = Harness::find(frames, h2::kRstStream, 1);
  BOOST_TEST_REQUIRE(rst.has_value());
  BOOST_TEST(rst->error_code() == h2::kCancel);
  BOOST_TEST(!Harness::find(frames, h2::kRstStream, 3).has_value());
}

BOOST_AUTO_TEST_CASE(spec_C39_an_answer_in_pieces_waits_for_each_piece) {
  Harness h;
  h.open();
  h.feed(h2::headers(1, h2::request_fields("GET", "/download"), true));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);
  http::H2Stream& s = *h.ready[0];
  http::Response res{bhttp::status::ok, 11};
  res.body() = "first,";
  h.codec->submit(s, res, false, true);
  auto frames = h.frames();
  BOOST_TEST(Harness::find(frames, h2::kData, 1)->payload == "first,");
  BOOST_TEST(h.pieces_taken >= 1u);
  BOOST_TEST(!h.closed.size());
  s.out = "last";
  s.out_sent = 0;
  s.out_eof = true;
  h.codec->more(s);
  frames = h.frames();
  const auto last = Harness::find(frames, h2::kData, 1);
  BOOST_TEST_REQUIRE(last.has_value());
  BOOST_TEST(last->payload == "last");
  BOOST_TEST((last->flags & h2::kEndStream) != 0);
  h.codec->finished(s);
  BOOST_TEST(h.closed == std::vector<std::int32_t>{1});
}

BOOST_AUTO_TEST_CASE(spec_C51_rapid_reset_goaway_names_the_last_stream_served) {
  Harness h(4);
  h.open();
  // Opened and reset at once while their handlers go on: 2 x 4 run, the ninth is not served.
  std::string burst;
  for (std::uint32_t id = 1; id <= 17; id += 2) {
    burst += h2::headers(id, h2::request_fields("GET", "/rr"), true);
    burst += h2::rst_stream(id, h2::kCancel);
  }
  BOOST_TEST(!h.feed(burst));
  BOOST_TEST(h.codec->calm());
  BOOST_TEST(h.calmed_reasons == std::vector<std::string>{"rapid_reset"});
  BOOST_TEST(h.ready.size() == 8u);
  BOOST_TEST(h.codec->running() == 8u);
  const auto goaway = Harness::find(h.frames(), h2::kGoaway, 0);
  BOOST_TEST_REQUIRE(goaway.has_value());
  BOOST_TEST(goaway->error_code() == h2::kEnhanceYourCalm);
  BOOST_TEST(goaway_last_stream(*goaway) == 15u);  // stream 17 never ran
  for (auto& s : h.ready) h.codec->finished(*s);
  BOOST_TEST(h.codec->running() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C51_a_ping_flood_ends_the_connection) {
  Harness h;
  h.open();
  std::string pings;
  for (int i = 0; i < 1100; ++i) pings += h2::ping(static_cast<std::uint64_t>(i));
  BOOST_TEST(!h.feed(pings));
  BOOST_TEST(h.calmed_reasons == std::vector<std::string>{"flood"});
  const auto goaway = Harness::find(h.frames(), h2::kGoaway, 0);
  BOOST_TEST_REQUIRE(goaway.has_value());
  BOOST_TEST(goaway->error_code() == h2::kEnhanceYourCalm);
}

BOOST_AUTO_TEST_CASE(spec_C51_an_hpack_bomb_ends_the_connection) {
  Harness h(100, 4096, 256);
  h.open();
  h2::Fields many;
  for (int i = 0; i < 12; ++i) many.emplace_back("x-f" + std::to_string(i), std::string(100, 'v'));
  BOOST_TEST(!h.feed(h2::headers(1, h2::request_fields("GET", "/", many), true)));
  BOOST_TEST(h.calmed_reasons == std::vector<std::string>{"header_bomb"});
  BOOST_TEST(h.ready.empty());
}

BOOST_AUTO_TEST_CASE(spec_C51_a_continuation_flood_of_small_frames_gets_goaway) {
  Harness h;  // 1 KiB of header list: the frames below stay under it
  h.open();
  std::string flood =
      h2::frame(h2::kHeaders, 0, 1, h2::header_block(h2::request_fields("GET", "/")));
  for (int i = 0; i < 64; ++i) {
    flood += h2::frame(h2::kContinuation, 0, 1, h2::header_block({{"x", "1"}}));
  }
  BOOST_TEST(!h.feed(flood));
  BOOST_TEST(h.calmed_reasons == std::vector<std::string>{"continuation_flood"});
  const auto goaway = Harness::find(h.frames(), h2::kGoaway, 0);
  BOOST_TEST_REQUIRE(goaway.has_value());
  BOOST_TEST(goaway->error_code() == h2::kEnhanceYourCalm);
  BOOST_TEST(h.ready.empty());
}

BOOST_AUTO_TEST_CASE(spec_C51_a_megabyte_of_unknown_frames_ends_the_connection) {
  Harness h;
  h.open();
  const std::string unknown = h2::frame(0x42, 0, 0, std::string(16000, 'u'));
  bool open = true;
  for (int i = 0; i < 80 && open; ++i) open = h.feed(unknown);
  BOOST_TEST(!open);
  BOOST_TEST(h.calmed_reasons == std::vector<std::string>{"flood"});
}

BOOST_AUTO_TEST_CASE(spec_C50_a_streamed_body_is_handed_out_at_its_header_and_held_to_its_window) {
  Harness h(100, 1000);  // max_request_body 1000: streamed bodies are not bound by it
  h.stream_bodies = true;
  h.open();
  h.feed(h2::headers(1, h2::request_fields("PUT", "/upload"), false));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);  // at its header, before any body
  http::H2Stream& s = *h.ready[0];
  BOOST_TEST(s.streaming);
  // The stream's window is raised to stream_buffer (64 KiB by default).
  h.feed(h2::data(1, std::string(16000, 'a'), false));
  h.feed(h2::data(1, std::string(16000, 'b'), false));
  h.feed(h2::data(1, std::string(16000, 'c'), false));
  BOOST_TEST(s.upload.size() == 48000u);
  BOOST_TEST(h.bodies_arrived == 3u);
  std::string piece;
  h.codec->take_body(s, piece);
  BOOST_TEST(piece.size() == 48000u);
  BOOST_TEST(s.upload.empty());
  // Taking it gave the window back.
  BOOST_TEST(Harness::find(h.frames(), h2::kWindowUpdate, 1).has_value());
  h.feed(h2::data(1, "end", true));
  BOOST_TEST(s.upload_done);
  h.codec->take_body(s, piece);
  BOOST_TEST(piece == "end");
  h.answer(s, "stored");
  BOOST_TEST(Harness::find(h.frames(), h2::kData, 1)->payload == "stored");
  BOOST_TEST(h.calmed_reasons.empty());
}

BOOST_AUTO_TEST_CASE(spec_C47_an_answer_before_the_streamed_body_ended_drops_the_rest) {
  Harness h;
  h.stream_bodies = true;
  h.open();
  h.feed(h2::headers(1, h2::request_fields("POST", "/early"), false));
  BOOST_TEST_REQUIRE(h.ready.size() == 1u);
  http::H2Stream& s = *h.ready[0];
  h.feed(h2::data(1, std::string(1000, 'x'), false));
  h.answer(s, "no thanks");
  h.frames();
  BOOST_TEST(s.upload_discarded);
  BOOST_TEST(s.upload.empty());
  // What still comes is read and dropped, the window given back: the client is never stuck.
  h.feed(h2::data(1, std::string(16000, 'y'), false));
  BOOST_TEST(s.upload.empty());
  BOOST_TEST(!Harness::find(h.frames(), h2::kRstStream, 1).has_value());
  h.feed(h2::data(1, "", true));
  BOOST_TEST(h.closed == std::vector<std::int32_t>{1});
}
