#include "gateway/common/json_log.hpp"

#include <poll.h>
#include <spdlog/formatter.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <atomic>
#include <boost/json/serialize.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

namespace idemgate::common {

namespace {

using Buffer = spdlog::memory_buf_t;

// One resize and one memcpy: fmt's own append copies through a generic loop that costs
// several times more for the short pieces a log line is made of.
void append(Buffer& out, std::string_view text) {
  const std::size_t at = out.size();
  out.resize(at + text.size());
  std::memcpy(out.data() + at, text.data(), text.size());
}

// True when one of the 8 bytes of `word` is below 0x20, `"` or `\\`: a byte to escape. A word
// with none is copied as it is. (Per byte, `(b - n) & ~b & 0x80` is set for b < n <= 0x80; a
// borrow from a byte that is set may set a higher one, which only sends the word to the byte
// loop. Bytes of 0x80 and above have ~b's high bit clear and never count.)
bool word_needs_escape(std::uint64_t word) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL;
  constexpr std::uint64_t kHighs = 0x8080808080808080ULL;
  const auto below = [&](std::uint64_t w, unsigned n) { return (w - kOnes * n) & ~w & kHighs; };
  return (below(word, 0x20) | below(word ^ (kOnes * '"'), 1) | below(word ^ (kOnes * '\\'), 1)) !=
         0;
}

// The escaping of boost::json::serialize: `"` and `\`, the short escapes \b \t \n \f \r, other
// control characters as \u00XX; every other byte as it is. Runs of plain bytes are found eight
// at a time and appended at once.
void append_string(Buffer& out, std::string_view text) {
  static constexpr char kHexDigits[] = "0123456789abcdef";
  out.push_back('"');
  const char* const data = text.data();
  const std::size_t size = text.size();
  std::size_t plain = 0;
  std::size_t i = 0;
  while (i < size) {
    if (size - i >= 8) {
      std::uint64_t word;
      std::memcpy(&word, data + i, sizeof word);
      if (!word_needs_escape(word)) {
        i += 8;
        continue;
      }
    }
    const auto c = static_cast<unsigned char>(data[i++]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    append(out, std::string_view(data + plain, i - 1 - plain));
    plain = i;
    out.push_back('\\');
    switch (c) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\b':
        out.push_back('b');
        break;
      case '\t':
        out.push_back('t');
        break;
      case '\n':
        out.push_back('n');
        break;
      case '\f':
        out.push_back('f');
        break;
      case '\r':
        out.push_back('r');
        break;
      default:
        append(out, "u00");
        out.push_back(kHexDigits[c >> 4]);
        out.push_back(kHexDigits[c & 15]);
    }
  }
  append(out, std::string_view(data + plain, size - plain));
  out.push_back('"');
}

// Numbers without a format string: the access line writes three per request.
template <class Integer>
void append_integer(Buffer& out, Integer value) {
  char text[24];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  append(out, std::string_view(text, static_cast<std::size_t>(end - text)));
}

// `value` with three decimals, as fmt's {:.3f}. A duration (finite, 0 to 10^12) is rendered
// from its thousandths as an integer, rounded half away from zero (std::llround): this differs
// from the exact rounding of std::to_chars only for a value within one ulp of a half-thousandth.
// Anything else goes through std::to_chars, which costs about ten times more.
void append_fixed3(Buffer& out, double value) {
  if (value >= 0.0 && value < 1e12) {
    const long long thousandths = std::llround(value * 1000.0);
    append_integer(out, thousandths / 1000);
    const auto fraction = static_cast<int>(thousandths % 1000);
    const char digits[] = {'.', static_cast<char>('0' + fraction / 100),
                           static_cast<char>('0' + fraction / 10 % 10),
                           static_cast<char>('0' + fraction % 10)};
    append(out, std::string_view(digits, sizeof digits));
    return;
  }
  char text[48];
  const auto [end, ec] =
      std::to_chars(text, text + sizeof text, value, std::chars_format::fixed, 3);
  if (ec == std::errc{}) {
    append(out, std::string_view(text, static_cast<std::size_t>(end - text)));
  } else {
    fmt::format_to(std::back_inserter(out), "{:.3f}", value);  // too long for the stack buffer
  }
}

// Boost.JSON writes doubles as 6.64E-1; durations read better as 0.664.
void append_value(Buffer& out, const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::string:
      append_string(out, v.get_string());
      break;
    case boost::json::kind::double_:
      append_fixed3(out, v.get_double());
      break;
    case boost::json::kind::int64:
      append_integer(out, v.get_int64());
      break;
    case boost::json::kind::uint64:
      append_integer(out, v.get_uint64());
      break;
    case boost::json::kind::bool_:
      append(out, v.get_bool() ? "true" : "false");
      break;
    default:
      append(out, boost::json::serialize(v));
  }
}

void append_rfc3339(Buffer& out, std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t secs =
      static_cast<std::time_t>(std::chrono::floor<std::chrono::seconds>(ms).count());
  // The calendar part changes once a second: it is rendered once per second and thread.
  struct Second {
    std::time_t secs = std::numeric_limits<std::time_t>::min();
    std::string text;  // "2026-12-05T07:10:42"
  };
  thread_local Second second;
  if (second.secs != secs) {
    std::tm tm{};
    gmtime_r(&secs, &tm);
    second.text = fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}", tm.tm_year + 1900,
                              tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    second.secs = secs;
  }
  append(out, second.text);
  const auto milli = static_cast<int>(ms.count() - std::chrono::milliseconds::rep{secs} * 1000);
  const char fraction[] = {'.', static_cast<char>('0' + milli / 100),
                           static_cast<char>('0' + milli / 10 % 10),
                           static_cast<char>('0' + milli % 10), 'Z'};
  append(out, std::string_view(fraction, sizeof fraction));
}

// `{"time":…,"level":…` — the opening every line shares.
void append_head(Buffer& out, std::string_view level, std::chrono::system_clock::time_point time) {
  append(out, "{\"time\":\"");
  append_rfc3339(out, time);
  append(out, "\",\"level\":\"");
  append(out, level);
  out.push_back('"');
}

void append_key(Buffer& out, std::string_view key) {
  out.push_back(',');
  append_string(out, key);
  out.push_back(':');
}

std::string_view level_name(spdlog::level::level_enum level) {
  const auto name = spdlog::level::to_string_view(level);
  return {name.data(), name.size()};
}

// One line of log_json: time, level, msg, then `fields` in their order (a `msg` among them
// replaces the message in its place; `level` and `time` are not repeated).
void render(Buffer& out, std::string_view level, std::string_view msg,
            const boost::json::object& fields) {
  // A caller's own time (e.g. when the request started) replaces the current one.
  const auto* given = fields.if_contains("time");
  if (given != nullptr && given->is_string()) {
    append(out, "{\"time\":");
    append_string(out, given->get_string());
    append(out, ",\"level\":\"");
    append(out, level);
    out.push_back('"');
  } else {
    append_head(out, level, std::chrono::system_clock::now());
  }
  append_key(out, "msg");
  const auto* own_msg = fields.if_contains("msg");
  if (own_msg != nullptr) {
    append_value(out, *own_msg);
  } else {
    append_string(out, msg);
  }
  for (const auto& field : fields) {
    if (field.key() == "level" || field.key() == "time" || field.key() == "msg") continue;
    append_key(out, field.key());
    append_value(out, field.value());
  }
  out.push_back('}');
}

// A thread's reused buffers: one for rendering a line, one for the sink's formatting of it.
Buffer& render_buffer() {
  thread_local Buffer buffer;
  buffer.clear();
  return buffer;
}

Buffer& format_buffer() {
  thread_local Buffer buffer;
  buffer.clear();
  return buffer;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, Buffer& dest) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    if (!text.empty() && text.front() == '{') {
      append(dest, text);  // already a JSON object from log_json
    } else {
      // Notices of libraries and plain messages become JSON lines too (SPEC C32).
      append_head(dest, level_name(msg.level), msg.time);
      append_key(dest, "msg");
      append_string(dest, text);
      dest.push_back('}');
    }
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// ---------------------------------------------------------------------------------------------

/// Lines one thread has logged that the writer has not taken yet.
struct Slot {
  std::mutex mutex;  // the owning thread and, every interval, the writer
  std::string lines;
  std::uint64_t dropped = 0;
  bool retired = false;  // the thread has ended: the writer forgets the slot once it is empty
};

std::atomic<std::uint64_t> next_sink_id{1};

/// Set by log_access around its call into the logger: an access line may wait for the writer's
/// next round; any other line (rare: start-up, reloads, the cleaner, failures) wakes it at once.
thread_local bool access_line = false;

/// The calling thread's slot of the sink with this id (a thread logs to one sink at a time).
struct ThreadSlot {
  std::uint64_t sink_id = 0;
  std::shared_ptr<Slot> slot;

  ThreadSlot() = default;
  ThreadSlot(const ThreadSlot&) = delete;
  ThreadSlot& operator=(const ThreadSlot&) = delete;
  ~ThreadSlot() { retire(); }

  void retire() {
    if (!slot) return;
    std::lock_guard lock(slot->mutex);
    slot->retired = true;
  }
};

/// See make_batched_logger. Every thread appends its lines to a slot of its own; one writer
/// thread takes them all every kInterval (at once for a line other than an access line, or when
/// a slot holds kBatchBytes) and writes them with as few write(2) calls as it can.
class BatchingSink final : public spdlog::sinks::sink {
 public:
  static constexpr std::size_t kBatchBytes = 32 * 1024;
  static constexpr std::size_t kMaxPendingBytes = 1024 * 1024;
  static constexpr auto kInterval = std::chrono::milliseconds(50);
  static constexpr auto kFlushWait = std::chrono::seconds(2);

  explicit BatchingSink(int fd)
      : fd_(fd), formatter_(std::make_unique<JsonFormatter>()), writer_([this] { run(); }) {}

  ~BatchingSink() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    writer_.join();
  }

  BatchingSink(const BatchingSink&) = delete;
  BatchingSink& operator=(const BatchingSink&) = delete;

  void log(const spdlog::details::log_msg& msg) override {
    auto& line = format_buffer();
    formatter_->format(msg, line);
    if (put(std::string_view(line.data(), line.size())) || !access_line ||
        msg.level >= spdlog::level::warn) {
      wake();
    }
  }

  /// An access line rendered whole (a JSON object and its newline), past spdlog: its message
  /// object, clock read and formatter copy are what the line's own rendering costs again. It
  /// waits for the writer's next round like any access line.
  void put_access(std::string_view line) {
    if (put(line)) wake();
  }

  /// Blocks until every line logged before the call has been written (at most kFlushWait).
  void flush() override {
    std::unique_lock lock(mutex_);
    const std::uint64_t ticket = ++flush_requests_;
    urgent_ = true;
    wake_.notify_one();
    written_.wait_for(lock, kFlushWait, [&] { return flushed_ >= ticket || !running_; });
  }

  void set_pattern(const std::string& pattern) override {
    formatter_ = std::make_unique<spdlog::pattern_formatter>(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    formatter_ = std::move(formatter);
  }

 private:
  /// Appends `line` to the calling thread's slot; true when the slot is full enough for the
  /// writer to come at once. A line the stuck writer has no room for is dropped and counted.
  bool put(std::string_view line) {
    Slot& slot = own_slot();
    std::lock_guard lock(slot.mutex);
    if (slot.lines.size() + line.size() > kMaxPendingBytes) {
      ++slot.dropped;  // the writer is stuck: never make the caller wait for it
      return false;
    }
    slot.lines.append(line.data(), line.size());
    return slot.lines.size() >= kBatchBytes;
  }

  Slot& own_slot() {
    thread_local ThreadSlot mine;
    if (mine.sink_id != id_) {
      mine.retire();
      mine.slot = std::make_shared<Slot>();
      mine.sink_id = id_;
      std::lock_guard lock(mutex_);
      slots_.push_back(mine.slot);
    }
    return *mine.slot;
  }

  void wake() {
    {
      std::lock_guard lock(mutex_);
      urgent_ = true;
    }
    wake_.notify_one();
  }

  void run() {
    std::string batch;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, kInterval, [this] { return urgent_ || stopping_; });
      urgent_ = false;
      const bool last = stopping_;
      const std::uint64_t round = flush_requests_;
      std::uint64_t dropped = 0;
      batch.clear();
      std::erase_if(slots_, [&](const std::shared_ptr<Slot>& slot) {
        std::lock_guard slot_lock(slot->mutex);
        batch += slot->lines;
        slot->lines.clear();
        dropped += slot->dropped;
        slot->dropped = 0;
        return slot->retired;
      });
      lock.unlock();
      if (dropped > 0) append_dropped(batch, dropped);
      write_all(batch);
      lock.lock();
      flushed_ = round;
      written_.notify_all();
      if (last) break;
    }
    running_ = false;
    written_.notify_all();
  }

  static void append_dropped(std::string& batch, std::uint64_t dropped) {
    Buffer line;
    append_head(line, "warning", std::chrono::system_clock::now());
    append(line, ",\"msg\":\"log lines dropped: the log output did not keep up\",\"dropped\":");
    append_integer(line, dropped);
    append(line, "}\n");
    batch.append(line.data(), line.size());
  }

  void write_all(std::string_view data) const {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n >= 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
      } else if (errno != EINTR) {
        return;  // nowhere to write to (closed, EPIPE): the lines are lost
      }
    }
  }

  const int fd_;
  const std::uint64_t id_ = next_sink_id++;
  std::unique_ptr<spdlog::formatter> formatter_;  // replaced only before logging starts

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable written_;
  std::vector<std::shared_ptr<Slot>> slots_;
  bool urgent_ = false;
  bool stopping_ = false;
  bool running_ = true;
  std::uint64_t flush_requests_ = 0;
  std::uint64_t flushed_ = 0;

  std::thread writer_;  // last: starts when everything above is ready
};

}  // namespace

void log_json(spdlog::level::level_enum level, std::string_view msg, boost::json::object fields) {
  auto* logger = spdlog::default_logger_raw();
  if (!logger->should_log(level)) return;
  auto& line = render_buffer();
  render(line, level_name(level), msg, fields);
  logger->log(level, spdlog::string_view_t(line.data(), line.size()));
}

void log_access(std::chrono::system_clock::time_point time, std::string_view route,
                std::string_view method, std::string_view target, unsigned status,
                std::string_view outcome, std::string_view key_hash, double upstream_ms,
                double total_ms, std::string_view client, bool written, std::string_view request_id,
                std::string_view trace_id, std::string_view ended, std::string_view protocol) {
  auto* logger = spdlog::default_logger_raw();
  if (!logger->should_log(spdlog::level::info)) return;
  auto& line = render_buffer();
  append_head(line, "info", time);
  append(line, ",\"msg\":\"access\"");
  append(line, ",\"route\":");
  append_string(line, route);
  append(line, ",\"method\":");
  append_string(line, method);
  append(line, ",\"target\":");
  append_string(line, target);
  append(line, ",\"status\":");
  append_integer(line, status);
  append(line, ",\"outcome\":");
  append_string(line, outcome);
  append(line, ",\"key_hash\":");
  append_string(line, key_hash);
  append(line, ",\"upstream_ms\":");
  append_fixed3(line, upstream_ms);
  append(line, ",\"total_ms\":");
  append_fixed3(line, total_ms);
  append(line, ",\"client\":");
  append_string(line, client);
  append(line, written ? ",\"written\":true" : ",\"written\":false");
  append(line, ",\"request_id\":");
  append_string(line, request_id);
  append(line, ",\"trace_id\":");
  append_string(line, trace_id);
  if (!ended.empty()) {
    append(line, ",\"ended\":");
    append_string(line, ended);
  }
  if (!protocol.empty()) {
    append(line, ",\"protocol\":");
    append_string(line, protocol);
  }
  line.push_back('}');
  // The gateway's own logger has one batching sink: the line goes straight into it.
  if (const auto& sinks = logger->sinks(); sinks.size() == 1) {
    spdlog::sinks::sink& only = *sinks.front();
    if (typeid(only) == typeid(BatchingSink) && only.should_log(spdlog::level::info)) {
      line.push_back('\n');
      static_cast<BatchingSink&>(only).put_access(std::string_view(line.data(), line.size()));
      return;
    }
  }
  access_line = true;
  logger->log(spdlog::level::info, spdlog::string_view_t(line.data(), line.size()));
  access_line = false;
}

std::unique_ptr<spdlog::formatter> make_json_formatter() {
  return std::make_unique<JsonFormatter>();
}

std::shared_ptr<spdlog::logger> make_batched_logger(const std::string& name, int fd) {
  auto logger = std::make_shared<spdlog::logger>(name, std::make_shared<BatchingSink>(fd));
  // Never flush on the logging thread: the sink writes warnings at once by itself.
  logger->flush_on(spdlog::level::off);
  return logger;
}

std::string format_rfc3339(std::chrono::system_clock::time_point t) {
  Buffer out;
  append_rfc3339(out, t);
  return fmt::to_string(out);
}

}  // namespace idemgate::common
