#pragma once
// Structured log lines: every message the HTTP shell logs is one JSON object (SPEC C32), written
// through spdlog's default logger, which main points at stderr.

#include <spdlog/common.h>
#include <boost/json/object.hpp>
#include <chrono>
#include <string>
#include <string_view>

namespace idemgate::http {

/// Logs `fields` plus `"msg": msg` as one JSON object on spdlog's default logger.
/// Thread safety: safe from any thread (spdlog's default logger is thread-safe).
void log_json(spdlog::level::level_enum level, std::string_view msg,
              boost::json::object fields = {});

/// `t` as an RFC 3339 UTC timestamp with milliseconds, e.g. `2026-01-31T12:00:00.123Z`.
std::string format_rfc3339(std::chrono::system_clock::time_point t);

}  // namespace idemgate::http
