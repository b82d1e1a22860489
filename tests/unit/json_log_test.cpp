// Log lines (SPEC C32): the access line's bytes, string escaping, and the batched logger's
// guarantees (whole lines, a thread's order, nothing lost on flush, never blocking the caller).
#define BOOST_TEST_MODULE json_log
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gateway/common/json_log.hpp"

namespace json = boost::json;
using idemgate::common::log_access;
using idemgate::common::log_json;
using idemgate::common::make_batched_logger;

namespace {

class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

/// Points the default logger at a capture sink for the scope of the object.
struct Capture {
  std::shared_ptr<CaptureSink> sink = std::make_shared<CaptureSink>();
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  Capture() { spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink)); }
  ~Capture() { spdlog::set_default_logger(previous); }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
};

/// Everything written to a pipe's read end until the write end closes.
class PipeReader {
 public:
  PipeReader() {
    int fds[2];
    BOOST_REQUIRE(::pipe(fds) == 0);
    read_fd_ = fds[0];
    write_fd = fds[1];
  }
  ~PipeReader() {
    close_write_end();
    if (reader_.joinable()) reader_.join();
    ::close(read_fd_);
  }
  PipeReader(const PipeReader&) = delete;
  PipeReader& operator=(const PipeReader&) = delete;

  void start() {
    reader_ = std::thread([this] {
      char chunk[4096];
      for (;;) {
        const ssize_t n = ::read(read_fd_, chunk, sizeof chunk);
        if (n <= 0) break;
        data_.append(chunk, static_cast<std::size_t>(n));
      }
    });
  }
  void close_write_end() {
    if (write_fd >= 0) ::close(write_fd);
    write_fd = -1;
  }
  /// The lines read, once the write end is closed.
  std::vector<std::string> lines() {
    close_write_end();
    if (reader_.joinable()) reader_.join();
    std::vector<std::string> out;
    std::istringstream in(data_);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    BOOST_TEST((data_.empty() || data_.back() == '\n'), "the output ends with a whole line");
    return out;
  }

  int write_fd = -1;

 private:
  int read_fd_ = -1;
  std::thread reader_;
  std::string data_;
};

/// How long a case waits for an event before it fails: a safety net against hangs, not a
/// measured threshold.
constexpr std::chrono::milliseconds kHangGuard{30'000};

// Strings that need every kind of escape, and bytes that need none.
const std::string kAwkward = std::string("q\"b\\s/\b\f\n\r\t\x01\x1f\x7f é ") + '\0' + "end";

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C32_access_line_is_byte_for_byte_the_log_json_line) {
  const auto started =
      std::chrono::system_clock::time_point(std::chrono::milliseconds(1769860800123));
  for (const std::string& route : {std::string("payments"), std::string(), kAwkward}) {
    Capture capture;
    log_json(spdlog::level::info, "access",
             {{"time", idemgate::common::format_rfc3339(started)},
              {"route", route},
              {"method", "POST"},
              {"target", "/p?x=\"1\""},
              {"status", 201u},
              {"outcome", "executed"},
              {"key_hash", "ab12"},
              {"upstream_ms", 1.5},
              {"total_ms", 12.3456},
              {"client", "127.0.0.1"},
              {"written", true},
              {"request_id", route},
              {"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"}});
    log_access(started, route, "POST", "/p?x=\"1\"", 201u, "executed", "ab12", 1.5, 12.3456,
               "127.0.0.1", true, route, "4bf92f3577b34da6a3ce929d0e0e4736");
    BOOST_REQUIRE_EQUAL(capture.sink->lines.size(), 2u);
    BOOST_TEST(capture.sink->lines[0] == capture.sink->lines[1]);
    const auto line = json::parse(capture.sink->lines[1]).as_object();
    BOOST_TEST(line.at("route").as_string() == route);
  }
  Capture capture;
  log_access(std::chrono::system_clock::time_point(std::chrono::milliseconds(1769860800123)), "r",
             "GET", "/", 404u, "no_route", "", 0.0, 0.25, "::1", false,
             "0f8fad5b-d9cb-469f-a165-70867728950e", "");
  BOOST_TEST(capture.sink->lines.at(0) ==
             R"({"time":"2026-01-31T12:00:00.123Z","level":"info","msg":"access","route":"r",)"
             R"("method":"GET","target":"/","status":404,"outcome":"no_route","key_hash":"",)"
             R"("upstream_ms":0.000,"total_ms":0.250,"client":"::1","written":false,)"
             R"("request_id":"0f8fad5b-d9cb-469f-a165-70867728950e","trace_id":""})");
  // The next second, and a millisecond under ten, after the first: the calendar part is not
  // kept from the line before.
  log_access(std::chrono::system_clock::time_point(std::chrono::milliseconds(1769860801007)), "r",
             "GET", "/", 404u, "no_route", "", 0.0, 0.25, "::1", false, "", "");
  BOOST_TEST(capture.sink->lines.back().starts_with(R"({"time":"2026-01-31T12:00:01.007Z",)"),
             capture.sink->lines.back());
  // An exchange the client ended says so last (SPEC C48).
  log_access(std::chrono::system_clock::time_point(std::chrono::milliseconds(1769860800123)), "r",
             "GET", "/events", 200u, "passthrough", "", 1.0, 2.0, "::1", false, "", "",
             "client_closed");
  BOOST_TEST(capture.sink->lines.back().ends_with(R"("trace_id":"","ended":"client_closed"})"),
             capture.sink->lines.back());
}

BOOST_AUTO_TEST_CASE(spec_C32_the_gateways_batched_logger_gets_the_same_access_line) {
  // The gateway's logger: log_access puts its line into the batching sink without spdlog.
  PipeReader pipe;
  pipe.start();
  const auto previous = spdlog::default_logger();
  const auto started =
      std::chrono::system_clock::time_point(std::chrono::milliseconds(1769860800123));
  {
    auto logger = make_batched_logger("batched", pipe.write_fd);
    spdlog::set_default_logger(logger);
    log_json(spdlog::level::info, "access",
             {{"time", idemgate::common::format_rfc3339(started)},
              {"route", kAwkward},
              {"method", "GET"},
              {"target", "/"},
              {"status", 200u},
              {"outcome", "passthrough"},
              {"key_hash", ""},
              {"upstream_ms", 0.5},
              {"total_ms", 1.0},
              {"client", "::1"},
              {"written", true},
              {"request_id", "id"},
              {"trace_id", ""}});
    log_access(started, kAwkward, "GET", "/", 200u, "passthrough", "", 0.5, 1.0, "::1", true, "id",
               "");
    // Below the logger's level, neither is written.
    logger->set_level(spdlog::level::warn);
    log_access(started, "quiet", "GET", "/", 200u, "passthrough", "", 0.5, 1.0, "::1", true, "",
               "");
    logger->flush();
    spdlog::set_default_logger(previous);
  }
  const auto lines = pipe.lines();
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  BOOST_TEST(lines[0] == lines[1]);
  BOOST_TEST(json::parse(lines[1]).as_object().at("route").as_string() == kAwkward);
}

BOOST_AUTO_TEST_CASE(spec_C32_fields_are_written_as_boost_json_writes_them_in_their_order) {
  Capture capture;
  log_json(spdlog::level::warn, "a \"message\"",
           {{"text", kAwkward},
            {"n", -3},
            {"u", 7u},
            {"ok", false},
            {"ms", 0.6642},
            {"list", json::array{1, "x"}},
            {"none", nullptr}});
  const auto& text = capture.sink->lines.at(0);
  const auto prefix = std::string(R"({"time":")");
  BOOST_TEST(text.substr(0, prefix.size()) == prefix);
  const auto rest = text.substr(text.find(R"(","level")"));
  BOOST_TEST(rest == R"(","level":"warning","msg":"a \"message\"","text":)" +
                         json::serialize(json::string_view(kAwkward)) +
                         R"(,"n":-3,"u":7,"ok":false,"ms":0.664,"list":[1,"x"],"none":null})");
  BOOST_TEST(json::parse(text).as_object().at("text").as_string() == kAwkward);
}

BOOST_AUTO_TEST_CASE(spec_C32_strings_are_escaped_as_boost_json_escapes_them_at_every_position) {
  // Plain bytes are skipped eight at a time: a byte to escape at each place of a word, and in
  // the bytes after the last whole word, comes out as Boost.JSON writes it.
  Capture capture;
  for (const char special : {'"', '\\', '\n', '\x01', '\x1f'}) {
    for (std::size_t at = 0; at < 21; ++at) {
      std::string text(21, 'a');
      text[at] = special;
      text[20 - at / 2] = static_cast<char>(0xc3);  // a byte over 0x7f is never escaped
      log_json(spdlog::level::info, "m", {{"text", text}});
      const auto& line = capture.sink->lines.back();
      BOOST_TEST(line.ends_with(",\"text\":" + json::serialize(json::string_view(text)) + "}"),
                 line);
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C32_durations_have_three_decimals) {
  Capture capture;
  const std::pair<double, std::string_view> cases[] = {{0.0, "0.000"},
                                                       {0.0004, "0.000"},
                                                       {0.0006, "0.001"},
                                                       {1.5, "1.500"},
                                                       {12.3456, "12.346"},
                                                       {999.9996, "1000.000"},
                                                       {86'400'000.25, "86400000.250"},
                                                       {2e12, "2000000000000.000"}};
  for (const auto& [ms, text] : cases) {
    log_json(spdlog::level::info, "m", {{"ms", ms}});
    const auto& line = capture.sink->lines.back();
    BOOST_TEST(line.ends_with(",\"ms\":" + std::string(text) + "}"), line);
  }
}

BOOST_AUTO_TEST_CASE(batched_logger_writes_whole_lines_in_each_threads_order) {
  PipeReader pipe;
  pipe.start();
  constexpr int kThreads = 4;
  constexpr int kLines = 3000;
  {
    auto logger = make_batched_logger("batched", pipe.write_fd);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&logger, t] {
        for (int i = 0; i < kLines; ++i) {
          // Lengths vary so that lines straddle the writer's batches and the pipe's buffer.
          logger->info("t{} {} {}", t, i, std::string(static_cast<std::size_t>(i % 300), 'x'));
        }
      });
    }
    for (auto& thread : threads) thread.join();
    logger->flush();
  }
  std::map<int, int> next;
  int count = 0;
  for (const auto& line : pipe.lines()) {
    const auto object = json::parse(line).as_object();  // whole JSON lines, never interleaved
    std::istringstream msg(std::string(object.at("msg").as_string()));
    char tag = 0;
    int t = -1;
    int i = -1;
    msg >> tag >> t >> i;
    BOOST_TEST_REQUIRE(tag == 't');
    BOOST_TEST_REQUIRE(i == next[t], "thread " << t << " line " << i << " out of order");
    ++next[t];
    ++count;
  }
  BOOST_TEST(count == kThreads * kLines);
}

BOOST_AUTO_TEST_CASE(batched_logger_drops_and_counts_lines_instead_of_blocking_on_a_full_output) {
  PipeReader pipe;  // not read yet: the pipe fills and the writer blocks on it
  constexpr int kLines = 30000;
  const std::string filler(200, 'y');
  auto logger = make_batched_logger("batched", pipe.write_fd);
  // About 7 MB while nothing reads the pipe, which only starts being read once the logging has
  // returned: a logger that waited for its output would never return.
  auto logging = std::async(std::launch::async, [&] {
    for (int i = 0; i < kLines; ++i) logger->info("{} {}", i, filler);
  });
  const bool returned = logging.wait_for(kHangGuard) == std::future_status::ready;
  BOOST_TEST(returned, "logging waited for the blocked output");
  pipe.start();  // also lets a blocked logger go, so that the case ends either way
  logging.get();
  logger->flush();
  logger.reset();
  int kept = 0;
  std::uint64_t dropped = 0;
  for (const auto& line : pipe.lines()) {
    const auto object = json::parse(line).as_object();
    if (object.contains("dropped")) {
      BOOST_TEST(object.at("level") == "warning");
      dropped += object.at("dropped").to_number<std::uint64_t>();
    } else {
      ++kept;
    }
  }
  BOOST_TEST(dropped > 0u);
  BOOST_TEST(kept > 0);
  BOOST_TEST(kept + dropped == static_cast<std::uint64_t>(kLines));
}

BOOST_AUTO_TEST_CASE(batched_logger_writes_a_line_without_a_flush) {
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);
  auto logger = make_batched_logger("batched", fds[1]);
  logger->info("one line");
  // No flush: the writer's next round (every 50 ms) writes it.
  pollfd readable{fds[0], POLLIN, 0};
  BOOST_REQUIRE(::poll(&readable, 1, static_cast<int>(kHangGuard.count())) == 1);
  char buffer[512];
  const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
  BOOST_REQUIRE(n > 0);
  const std::string line(buffer, static_cast<std::size_t>(n));
  BOOST_TEST(line.back() == '\n');
  BOOST_TEST(json::parse(line).as_object().at("msg") == "one line");
  logger.reset();
  ::close(fds[0]);
  ::close(fds[1]);
}
