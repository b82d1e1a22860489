#pragma once
// The `Date` field's value (RFC 9110 §5.6.7).

#include <chrono>
#include <string>
#include <string_view>

namespace idemgate::common {

/// `t` in the IMF-fixdate form of RFC 9110 §5.6.7 (`Sun, 06 Nov 1994 08:49:37 GMT`).
/// Locale-independent; safe from any thread.
std::string format_http_date(std::chrono::system_clock::time_point t);

/// The current time as format_http_date writes it, formatted at most once per second per thread
/// (nginx's cached time, for the `Date` of every answer). The view stays valid until the calling
/// thread calls again.
std::string_view http_date_now();

}  // namespace idemgate::common
