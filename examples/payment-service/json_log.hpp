#pragma once
// One JSON object per line on stderr for everything the payment service reports.

#include <spdlog/common.h>

#include <boost/json/object.hpp>
#include <string_view>

namespace idemgate::examples::payment {

/// Installs the stderr logger as spdlog's default; call once at start, before any thread.
void init_json_log();

/// Writes `{"time":…,"level":…,"msg":…, fields…}` as one line (time in UTC, milliseconds).
/// Thread-safe.
void log_json(spdlog::level::level_enum level, std::string_view msg,
              boost::json::object fields = {});

}  // namespace idemgate::examples::payment
