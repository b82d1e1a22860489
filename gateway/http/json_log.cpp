#include "gateway/http/json_log.hpp"

#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>
#include <boost/json/serialize.hpp>
#include <cstdio>
#include <ctime>

namespace idemgate::http {

namespace {

// Boost.JSON writes doubles as 6.64E-1; durations read better as 0.664.
void append_value(std::string& out, const boost::json::value& v) {
  if (v.is_double()) {
    out += fmt::format("{:.3f}", v.get_double());
  } else {
    out += boost::json::serialize(v);
  }
}

std::string render(std::string_view level, const boost::json::object& fields) {
  // A caller's own time (e.g. when the request started) replaces the current one.
  const auto* given = fields.if_contains("time");
  const std::string time = given != nullptr && given->is_string()
                               ? std::string(given->get_string())
                               : format_rfc3339(std::chrono::system_clock::now());
  std::string out = "{\"time\":" + boost::json::serialize(boost::json::string_view(time)) +
                    ",\"level\":\"" + std::string(level) + "\"";
  for (const auto& field : fields) {
    if (field.key() == "level" || field.key() == "time") continue;
    out += ',';
    out += boost::json::serialize(boost::json::string_view(field.key()));
    out += ':';
    append_value(out, field.value());
  }
  out += '}';
  return out;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string line;
    if (!text.empty() && text.front() == '{') {
      line = std::string(text);  // already a JSON object from log_json
    } else {
      // Notices of libraries and plain messages become JSON lines too (SPEC C32).
      boost::json::object fields;
      fields["msg"] = text;
      line = render(std::string_view(level.data(), level.size()), fields);
    }
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

void log_json(spdlog::level::level_enum level, std::string_view msg, boost::json::object fields) {
  boost::json::object line;
  line.reserve(fields.size() + 1);
  line["msg"] = msg;
  for (auto& field : fields) line[field.key()] = std::move(field.value());
  const auto name = spdlog::level::to_string_view(level);
  spdlog::log(level, "{}", render(std::string_view(name.data(), name.size()), line));
}

std::unique_ptr<spdlog::formatter> make_json_formatter() {
  return std::make_unique<JsonFormatter>();
}

std::string format_rfc3339(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t secs =
      static_cast<std::time_t>(std::chrono::floor<std::chrono::seconds>(ms).count());
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return out;
}

}  // namespace idemgate::http
