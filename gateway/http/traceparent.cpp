#include "gateway/http/traceparent.hpp"

#include <algorithm>

namespace idemgate::http {

namespace {

bool lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool all_zero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; });
}

}  // namespace

std::string_view traceparent_trace_id(std::string_view value) {
  // 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
  // 0  3                                36               53
  constexpr std::size_t kLength = 55;
  if (value.size() < kLength) return {};
  const auto version = value.substr(0, 2);
  if (!lower_hex(version) || version == "ff") return {};
  if (version == "00" ? value.size() != kLength : value.size() > kLength && value[kLength] != '-') {
    return {};
  }
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return {};
  const auto trace_id = value.substr(3, kTraceIdBytes);
  const auto parent_id = value.substr(36, 16);
  const auto flags = value.substr(53, 2);
  if (!lower_hex(trace_id) || !lower_hex(parent_id) || !lower_hex(flags)) return {};
  if (all_zero(trace_id) || all_zero(parent_id)) return {};
  return trace_id;
}

std::string_view request_trace_id(const boost::beast::http::fields& fields) {
  const auto found = fields.find("traceparent");
  if (found == fields.end() || fields.count("traceparent") != 1) return {};
  return traceparent_trace_id(found->value());
}

}  // namespace idemgate::http
