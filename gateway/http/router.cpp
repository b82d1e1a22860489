#include "gateway/http/router.hpp"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/url/grammar/hexdig_chars.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>
#include <optional>

#include "gateway/common/host_port.hpp"

namespace idemgate::http {
namespace {

bool host_matches(std::string_view pattern, std::string_view host) {
  if (pattern.empty()) return true;
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);  // FQDN form names the same host
  if (pattern.starts_with("*.")) {
    const auto suffix = pattern.substr(1);  // ".example.com"
    return host.size() > suffix.size() &&
           boost::beast::iequals(host.substr(host.size() - suffix.size()), suffix);
  }
  return boost::beast::iequals(pattern, host);
}

bool path_matches(const Match& m, std::string_view path) {
  if (!m.path.empty() && path != m.path) return false;
  if (!m.path_prefix.empty() && !path.starts_with(m.path_prefix)) return false;
  return true;
}

bool method_matches(const std::vector<std::string>& methods, std::string_view method) {
  return methods.empty() || std::find(methods.begin(), methods.end(), method) != methods.end();
}

bool needs_normalizing(std::string_view path) {
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%') return true;
    if (path[i] == '/' && i + 1 < path.size() && (path[i + 1] == '/' || path[i + 1] == '.'))
      return true;
  }
  return false;
}

}  // namespace

std::string_view normalized_path(std::string_view path, std::string& scratch) {
  if (!path.starts_with('/') || !needs_normalizing(path)) return path;
  // Unreserved characters decoded first, so that `%2e%2E` is a `..` segment.
  std::string decoded;
  decoded.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    const int hi = path[i] == '%' && i + 2 < path.size()
                       ? boost::urls::grammar::hexdig_value(path[i + 1])
                       : -1;
    const int lo = hi >= 0 ? boost::urls::grammar::hexdig_value(path[i + 2]) : -1;
    if (lo < 0) {
      // A `%` that starts no escape stands for itself: written `%25`, so that `%%32e` does not
      // become an escape (`%2e`) for the next normalization to decode.
      if (path[i] == '%') {
        decoded += "%25";
      } else {
        decoded.push_back(path[i]);
      }
      continue;
    }
    const char c = static_cast<char>(hi * 16 + lo);
    if (boost::urls::unreserved_chars(c)) {  // RFC 3986 §2.3
      decoded.push_back(c);
    } else {
      constexpr std::string_view kHex = "0123456789ABCDEF";
      decoded += {'%', kHex[static_cast<std::size_t>(hi)], kHex[static_cast<std::size_t>(lo)]};
    }
    i += 2;
  }
  // Segments between slashes; empty ones (a run of `/`) and `.` vanish, `..` takes one back.
  scratch.clear();
  std::size_t at = 1;          // after the leading `/`
  bool ends_in_slash = false;  // the last segment is empty, `.` or `..`: the path ends in `/`
  while (at <= decoded.size()) {
    std::size_t end = decoded.find('/', at);
    if (end == std::string::npos) end = decoded.size();
    const std::string_view segment(decoded.data() + at, end - at);
    if (segment == "..") {
      const auto cut = scratch.rfind('/');
      scratch.resize(cut == std::string::npos ? 0 : cut);
    } else if (!segment.empty() && segment != ".") {
      scratch += '/';
      scratch += segment;
    }
    ends_in_slash = segment.empty() || segment == "." || segment == "..";
    at = end + 1;
  }
  if (scratch.empty() || ends_in_slash) scratch += '/';
  return scratch;
}

const Route* match(const ProxyConfig& config, std::string_view host, std::string_view path,
                   std::string_view method) {
  std::string scratch;
  path = normalized_path(path, scratch);
  // The host part is cut out of the authority only once a route names a host.
  std::optional<std::string_view> name;
  for (const auto& route : config.routes) {
    if (!path_matches(route.match, path) || !method_matches(route.match.methods, method)) continue;
    if (!route.match.host.empty()) {
      if (!name) name = common::authority_host(host);
      if (!host_matches(route.match.host, *name)) continue;
    }
    return &route;
  }
  return nullptr;
}

std::string_view target_path(std::string_view target) {
  if (!target.starts_with('/')) {
    const auto scheme_end = target.find("://");
    if (scheme_end == std::string_view::npos) return target;
    const auto path_start = target.find_first_of("/?#", scheme_end + 3);
    if (path_start == std::string_view::npos || target[path_start] != '/') return "/";
    target.remove_prefix(path_start);
  }
  return target.substr(0, target.find_first_of("?#"));
}

}  // namespace idemgate::http
