#include "gateway/http/router.hpp"

#include <algorithm>
#include <boost/beast/core/string.hpp>
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

}  // namespace

const Route* match(const ProxyConfig& config, std::string_view host, std::string_view path,
                   std::string_view method) {
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
