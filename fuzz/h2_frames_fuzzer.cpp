// Fuzz target for HTTP/2 from clients (SPEC C49–C51): every byte a client sends after the
// connection preface goes through libnghttp2 and the gateway's stream glue
// (gateway/http/h2_codec.hpp), and each request that comes out is answered as the connection
// would answer it: assembled into the request the handler takes, then a problem or a 200 whose
// body is held whole or follows in pieces. Checks the bounds of C50/C51 after every step.
//
// Input: the first byte is options, the rest is the client's bytes after the preface.
//   bits 0-1: the size of the pieces the bytes are read in (1, 7, 64, or all at once);
//   bit 2: answers follow in three pieces (a passed-through body, C39) instead of held whole;
//   bit 3: handlers are slow: requests are answered only every fourth read (Rapid Reset);
//   bit 4: halfway, the requests whose bodies stopped arriving are reset (C07 per stream);
//   bit 5: bodies are streamed (C50): requests are handed out at their header and their bodies
//          taken as they arrive, never more than the stream's window of them held.
// Hand-written seeds are in fuzz/corpus/h2_frames/ (made by fuzz/h2_seeds.py).

#include <algorithm>
#include <boost/beast/http/field.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/check.hpp"
#include "gateway/config/config.hpp"
#include "gateway/http/h2_codec.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"

namespace bhttp = boost::beast::http;
namespace config = idemgate::config;
namespace http = idemgate::http;
using idemgate::fuzz::check;

namespace {

// Small, so that the fuzzer reaches every limit with short inputs.
constexpr std::size_t kMaxHeader = 512;
constexpr std::size_t kMaxBody = 2048;
constexpr std::size_t kMaxStreams = 8;
constexpr std::size_t kPieces = 3;

std::shared_ptr<const config::Config> fuzz_config() {
  auto cfg = std::make_shared<config::Config>();
  cfg->limits.max_header_bytes = kMaxHeader;
  cfg->limits.max_request_body = kMaxBody;
  cfg->limits.h2_max_concurrent_streams = kMaxStreams;
  cfg->limits.stream_buffer = 1024;
  return cfg;
}

struct Driver final : http::H2Events {
  std::vector<std::shared_ptr<http::H2Stream>> ready;
  std::size_t calms = 0;
  bool stream_bodies = false;

  bool streams_body(http::H2Stream& s) override {
    check(!s.answering && !s.streaming, "a stream is offered for streaming once");
    // As the connection does: only a request that would be routed is streamed.
    return stream_bodies && !http::assemble_request(s);
  }

  void request_ready(std::shared_ptr<http::H2Stream> s) override {
    check(s->answering && !s->submitted, "a request is handed out once, before its answer");
    ready.push_back(std::move(s));
  }
  void stream_closed(http::H2Stream& s) override {
    check(s.closed, "a closed stream says so");
    check(!s.waiting || !s.admitted, "a body is waiting or admitted, not both");
  }
  void piece_taken(http::H2Stream& s) override {
    check(s.out_sent == s.out.size(), "the codec asks for more only when it took all");
  }
  void calmed(std::string_view reason, std::string_view why) override {
    check(std::find(std::begin(http::kCalmReasons), std::end(http::kCalmReasons), reason) !=
              std::end(http::kCalmReasons),
          "a C51 bound has a known metric label");
    check(!why.empty(), "a C51 bound says why");
    ++calms;
  }
  void wants_write() override {}
};

/// One request answered as H2Connection answers it.
struct Answering {
  std::shared_ptr<http::H2Stream> stream;
  std::size_t pieces_left = 0;
};

void check_bounds(const http::H2Codec& codec, const Driver& driver) {
  check(codec.running() <= (http::h2_bounds::kRunningFactor + 1) * kMaxStreams,
        "requests in progress stay bounded (Rapid Reset)");
  check(codec.held_bodies() <= http::h2_bounds::kHeldBodiesFactor * kMaxBody,
        "admitted request bodies fit in kHeldBodiesFactor x max_request_body");
  check(codec.streams().size() <= (http::h2_bounds::kRunningFactor + 1) * kMaxStreams,
        "open streams stay bounded");
  check(driver.calms <= 1, "a connection is calmed once");
  for (const auto& [id, s] : codec.streams()) {
    check(s->request.body().size() <= kMaxBody, "a stream holds no more than max_request_body");
    check(s->id == id, "streams are filed under their id");
  }
}

/// Takes what a streaming stream's body brought, as the upstream writer does; true once the
/// body has ended (or will not go on).
bool take_upload(http::H2Codec& codec, http::H2Stream& s) {
  const std::size_t window = std::max<std::size_t>(1024, http::h2_bounds::kStreamWindow);
  check(s.upload.size() <= window, "a streamed body holds no more than its window");
  std::string piece;
  codec.take_body(s, piece);
  check(s.upload.empty(), "taking the body empties it");
  return s.upload_done || s.closed || s.upload_discarded || s.upload_too_large;
}

void answer(http::H2Codec& codec, const std::shared_ptr<http::H2Stream>& s, bool streamed,
            std::vector<Answering>& pumping) {
  auto reject = http::assemble_request(*s);
  check(s->request.body().size() <= kMaxBody, "a request body is within max_request_body");
  if (s->header_too_large) {
    check(reject && reject->problem == http::Problem::headers_too_large,
          "a header list past max_header_bytes is 431");
  } else if (s->body_too_large) {
    check(reject && reject->problem == http::Problem::payload_too_large,
          "a body past max_request_body is 413");
  }
  if (!reject) {
    check(s->header_bytes <= kMaxHeader, "a routed header list is within max_header_bytes");
    check(!s->method.empty() && !s->path.empty(), "a routed request has :method and :path");
    check(s->request.count(bhttp::field::host) <= 1, "one Host at most");
    if (s->request.has_content_length() && !s->streaming) {
      check(s->request[bhttp::field::content_length] == std::to_string(s->request.body().size()),
            "Content-Length is the body received");
    }
  }
  if (s->closed) {
    codec.finished(*s);  // reset while its handler ran: nothing to send
    return;
  }
  http::Response res;
  const bool head = s->request.method() == bhttp::verb::head;
  if (reject) {
    res = http::make_problem(reject->problem, std::move(reject->detail), 11, true);
    streamed = false;
  } else {
    res.result(200);
    res.set(bhttp::field::content_type, "text/plain");
    res.body() = s->path;
    res.body().append(s->request.body());
    res.prepare_payload();
  }
  const bool has_body = !head && http::status_has_body(res.result_int());
  if (streamed && has_body) res.erase(bhttp::field::content_length);
  codec.submit(*s, res, head, streamed && has_body);
  check(s->submitted, "a submitted answer says so");
  if (streamed && has_body && !s->closed) pumping.push_back({s, kPieces});
  codec.finished(*s);
}

/// Drains what the codec has to send; false once it cannot send.
bool flush(http::H2Codec& codec) {
  std::string out;
  for (int round = 0; round < 64; ++round) {
    out.clear();
    if (!codec.send(out, 64 * 1024)) return false;
    if (out.empty()) return true;
    codec.wrote();
  }
  return true;
}

/// Gives streamed answers their next piece once the codec took the last one.
void pump(http::H2Codec& codec, std::vector<Answering>& pumping) {
  for (auto& a : pumping) {
    http::H2Stream& s = *a.stream;
    if (s.closed || s.out_eof || a.pieces_left == 0 || s.out_sent < s.out.size()) continue;
    s.out.assign(100 * a.pieces_left, static_cast<char>('a' + a.pieces_left));
    s.out_sent = 0;
    s.out_eof = --a.pieces_left == 0;
    codec.more(s);
  }
  std::erase_if(pumping, [](const Answering& a) {
    return a.stream->closed || a.stream->out_eof || a.pieces_left == 0;
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t options = data[0];
  constexpr std::size_t kChunks[] = {1, 7, 64, SIZE_MAX};
  const std::size_t chunk = kChunks[options & 3];
  const bool streamed = (options & 4) != 0;
  const bool slow = (options & 8) != 0;
  const bool reset_stalled = (options & 16) != 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  const auto cfg = fuzz_config();
  Driver driver;
  http::H2Codec codec([cfg] { return cfg; }, driver);
  std::vector<Answering> pumping;
  driver.stream_bodies = (options & 32) != 0;
  std::vector<std::shared_ptr<http::H2Stream>> uploading;
  const auto answer_ready = [&] {
    auto batch = std::move(driver.ready);
    driver.ready.clear();
    for (auto& s : batch) {
      if (s->streaming) {
        uploading.push_back(std::move(s));
      } else {
        answer(codec, s, streamed, pumping);
      }
    }
    // A streamed request is answered once its body has gone up.
    std::erase_if(uploading, [&](const std::shared_ptr<http::H2Stream>& s) {
      if (!take_upload(codec, *s)) return false;
      answer(codec, s, streamed, pumping);
      return true;
    });
  };

  bool open = codec.receive(http::kH2Preface.data(), http::kH2Preface.size());
  check(open, "the preface alone is accepted");
  std::size_t reads = 0;
  for (std::size_t at = 0; open && at < input.size(); ++reads) {
    const std::size_t n = std::min(chunk, input.size() - at);
    open = codec.receive(input.data() + at, n);
    at += n;
    if (!open) check(codec.calm() || !codec.error().empty(), "a connection ends for a reason");
    if (!slow || reads % 4 == 3) answer_ready();
    if (reset_stalled && at >= input.size() / 2 && at - n < input.size() / 2) {
      codec.reset_stalled(http::H2Codec::Clock::now() + std::chrono::hours(1),
                          std::chrono::seconds(1));
    }
    check_bounds(codec, driver);
    if (!flush(codec)) break;
    pump(codec, pumping);
    check_bounds(codec, driver);
  }
  // The client stops sending: every handler ends, every answer is given its pieces.
  answer_ready();
  for (auto& s : uploading) answer(codec, s, streamed, pumping);
  uploading.clear();
  for (int round = 0; round < 16 && flush(codec); ++round) {
    pump(codec, pumping);
    answer_ready();
  }
  answer_ready();
  check(codec.running() == 0, "every request handed out was finished");
  check_bounds(codec, driver);
  return 0;
}
