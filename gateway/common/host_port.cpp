#include "gateway/common/host_port.hpp"

#include <algorithm>
#include <boost/url/parse.hpp>
#include <cctype>

#include "gateway/common/ows.hpp"

namespace idemgate::common {

HostPortParse parse_host_port(std::string_view text) {
  HostPortParse out;
  const auto authority = boost::urls::parse_authority(text);
  if (!authority) {
    // Several colons and no bracket: an IPv6 address written as in a URL it cannot be.
    if (!text.empty() && text.front() == '[') {
      out.error = text.find(']') == std::string_view::npos ? HostPortError::syntax
                                                           : HostPortError::bad_ipv6;
    } else if (std::count(text.begin(), text.end(), ':') > 1) {
      out.error = HostPortError::ipv6_unbracketed;
    }
    return out;
  }
  if (authority->has_userinfo() || !authority->has_port() ||
      authority->host_type() == boost::urls::host_type::ipvfuture) {
    return out;
  }
  const std::string_view host = authority->encoded_host_address();
  if (host.find('%') != std::string_view::npos) return out;
  const std::string_view port = authority->port();
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    out.error = HostPortError::bad_port;
    return out;
  }
  unsigned long number = 0;
  for (const char c : port) number = number * 10 + static_cast<unsigned long>(c - '0');
  if (number < 1 || number > 65535) {
    out.error = HostPortError::bad_port;
    return out;
  }
  out.value = HostPort{std::string(host), static_cast<std::uint16_t>(number)};
  return out;
}

std::string format_host_port(std::string_view host, std::uint16_t port) {
  std::string out;
  out.reserve(host.size() + 8);
  if (host.find(':') != std::string_view::npos) {
    out.push_back('[');
    out.append(host);
    out.push_back(']');
  } else {
    out.append(host);
  }
  out.push_back(':');
  out.append(std::to_string(port));
  return out;
}

std::string_view authority_host(std::string_view authority) {
  authority = trim_ows(authority);
  if (const auto parsed = boost::urls::parse_authority(authority);
      parsed && !parsed->has_userinfo()) {
    return parsed->encoded_host();
  }
  // Not an authority (e.g. `a b:80`): the routing rule still needs a name to compare.
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    return close == std::string_view::npos ? authority : authority.substr(0, close + 1);
  }
  const auto colon = authority.rfind(':');
  return colon == std::string_view::npos ? authority : authority.substr(0, colon);
}

}  // namespace idemgate::common
