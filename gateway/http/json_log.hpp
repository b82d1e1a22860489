#pragma once
// Structured log lines: every message the HTTP shell logs is one JSON object (SPEC C32), written
// through spdlog's default logger, which main points at stderr.

#include <spdlog/common.h>
#include <spdlog/formatter.h>
#include <boost/json/object.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace idemgate::http {

/// Logs `{"time", "level", "msg": msg, fields...}` as one JSON object on spdlog's default logger.
/// A `time` field in `fields` (RFC 3339 text) replaces the current time; doubles are written with
/// three decimals (durations in ms).
/// Thread safety: safe from any thread (spdlog's default logger is thread-safe).
void log_json(spdlog::level::level_enum level, std::string_view msg,
              boost::json::object fields = {});

/// A spdlog formatter that writes every message as one JSON object a line: messages from
/// log_json as they are, any other text (library notices, plain spdlog calls) wrapped as
/// {"time","level","msg"}. main installs it on the default logger.
std::unique_ptr<spdlog::formatter> make_json_formatter();

/// `t` as an RFC 3339 UTC timestamp with milliseconds, e.g. `2026-01-31T12:00:00.123Z`.
std::string format_rfc3339(std::chrono::system_clock::time_point t);

}  // namespace idemgate::http
