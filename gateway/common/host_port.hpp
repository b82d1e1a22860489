#pragma once
// `host:port` as RFC 3986 §3.2.2 writes an authority: a name, an IPv4 address, or an IPv6
// address in brackets (`[::1]:9001`). One reader (Boost.URL's parse_authority) and one writer for
// configuration values, Redis redirects, Host fields and log lines.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::common {

/// A host and port; `host` never carries brackets (`::1`, not `[::1]`).
struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

/// Why parse_host_port refused a text.
enum class HostPortError {
  syntax,            ///< not `host:port` (no port, user info, a path, bad characters)
  ipv6_unbracketed,  ///< an IPv6 address without brackets: `::1:9001`
  bad_ipv6,          ///< brackets around something that is not an IPv6 address: `[fe80::zz]:80`
  bad_port,          ///< the port is not 1–65535
};

/// The result of parse_host_port: a HostPort, or why there is none.
struct HostPortParse {
  std::optional<HostPort> value;
  HostPortError error = HostPortError::syntax;
};

/// Parses `host:port` with a port of 1–65535 (RFC 3986 authority without user info). An IPv6
/// address must be in brackets; a name is returned as written (percent-encoding is refused); the
/// host may be empty (`:7001`, as Redis Cluster names the node that answered). Pure.
HostPortParse parse_host_port(std::string_view text);

/// `host:port`, with brackets around `host` when it is an IPv6 address (contains ':'), e.g. for
/// the `Host` field of a request to `::1` port 9001: `[::1]:9001`.
std::string format_host_port(std::string_view host, std::uint16_t port);
/// format_host_port of `server`'s host and port.
inline std::string format_host_port(const HostPort& server) {
  return format_host_port(server.host, server.port);
}

/// The host part of an authority such as a `Host` field value (`Example.com:8080` →
/// `Example.com`, `[::1]:80` → `[::1]`): brackets are kept, case is kept. A value that is not
/// an authority is returned trimmed of white space, up to its last ':' when that follows no ']'.
/// The view points into `authority`. Pure.
std::string_view authority_host(std::string_view authority);

}  // namespace idemgate::common
