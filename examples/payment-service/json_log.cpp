#include "examples/payment-service/json_log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <boost/json/serialize.hpp>
#include <chrono>
#include <ctime>
#include <string>

namespace idemgate::examples::payment {
namespace {

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) %
                  std::chrono::seconds{1};
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return std::string(buf, n) + '.' + std::to_string(1000 + ms.count()).substr(1) + 'Z';
}

}  // namespace

void init_json_log() {
  auto logger = spdlog::stderr_logger_mt("payment-service");
  logger->set_pattern("%v");
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

void log_json(spdlog::level::level_enum level, std::string_view msg, boost::json::object fields) {
  boost::json::object line;
  line["time"] = utc_now();
  const auto name = spdlog::level::to_string_view(level);
  line["level"] = std::string_view(name.data(), name.size());
  line["msg"] = msg;
  for (auto& field : fields) line[field.key()] = std::move(field.value());
  spdlog::log(level, "{}", boost::json::serialize(line));
}

}  // namespace idemgate::examples::payment
