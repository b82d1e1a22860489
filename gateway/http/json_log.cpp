#include "gateway/http/json_log.hpp"

#include <spdlog/spdlog.h>
#include <boost/json/serialize.hpp>
#include <cstdio>
#include <ctime>

namespace idemgate::http {

void log_json(spdlog::level::level_enum level, std::string_view msg, boost::json::object fields) {
  boost::json::object line;
  line.reserve(fields.size() + 1);
  line["msg"] = msg;
  for (auto& field : fields) line[field.key()] = std::move(field.value());
  spdlog::log(level, "{}", boost::json::serialize(line));
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
