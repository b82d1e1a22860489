#include "gateway/common/http_date.hpp"

#include <cstdio>
#include <ctime>

namespace idemgate::common {

std::string format_http_date(std::chrono::system_clock::time_point t) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday],
                tm.tm_mday, kMonths[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                tm.tm_sec);
  return out;
}

std::string_view http_date_now() {
  struct Cached {
    std::time_t second = -1;
    std::string text;
  };
  thread_local Cached cached;
  const auto now = std::chrono::system_clock::now();
  const std::time_t second = std::chrono::system_clock::to_time_t(now);
  if (second != cached.second) {
    cached.text = format_http_date(now);
    cached.second = second;
  }
  return cached.text;
}

}  // namespace idemgate::common
