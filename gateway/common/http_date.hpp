#pragma once
// The `Date` field's value (RFC 9110 §5.6.7).

#include <chrono>
#include <string>

namespace idemgate::common {

/// `t` in the IMF-fixdate form of RFC 9110 §5.6.7 (`Sun, 06 Nov 1994 08:49:37 GMT`).
/// Locale-independent; safe from any thread.
std::string format_http_date(std::chrono::system_clock::time_point t);

}  // namespace idemgate::common
