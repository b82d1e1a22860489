#pragma once
// W3C Trace Context (https://www.w3.org/TR/trace-context/): the gateway forwards `traceparent`
// and `tracestate` unchanged (they are end-to-end fields, SPEC C02) and reads the trace id of a
// valid `traceparent` for its access line (conf/REFERENCE.md, "request_id").

#include <boost/beast/http/fields.hpp>
#include <cstddef>
#include <string_view>

namespace idemgate::http {

/// The length of a trace id: 32 lower-case hex digits.
inline constexpr std::size_t kTraceIdBytes = 32;

/// The trace id of a `traceparent` value, or "" when the value is not valid (W3C Trace Context
/// §3.2): `version "-" trace-id "-" parent-id "-" trace-flags`, 2 + 32 + 16 + 2 lower-case hex
/// digits; version `ff` is invalid, and so is an all-zero trace id or parent id. Version `00` is
/// exactly 55 characters; a higher version may carry more after a `-` at offset 55 (§4.3,
/// versioning). The returned view points into `value`. Pure.
std::string_view traceparent_trace_id(std::string_view value);

/// The trace id of the request whose header is `fields`: its one `traceparent` field parsed by
/// traceparent_trace_id; "" when there is none, more than one, or it is invalid. The view points
/// into `fields`.
std::string_view request_trace_id(const boost::beast::http::fields& fields);

}  // namespace idemgate::http
