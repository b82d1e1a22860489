#pragma once
// The configuration text the loader's unit tests start from, and how they load it: a test
// appends keys or replaces parts, and compares the loader's `t.yaml:LINE: key: problem` text.

#include <memory>
#include <string>

#include "gateway/config/config_loader.hpp"

namespace idemgate::test {

/// A minimal valid configuration of nine lines (one upstream `app`, one route `r` on `/`); a
/// test appends keys from line 10 on, so the line numbers of expected errors count from here.
inline const std::string kMinimalConfig =
    "listen: { address: 127.0.0.1, port: 0 }\n"                         // 1
    "storage:\n"                                                        // 2
    "  postgres: { dsn: \"postgresql://idem@127.0.0.1:5432/idem\" }\n"  // 3
    "upstreams:\n"                                                      // 4
    "  app: { servers: [\"127.0.0.1:9001\"] }\n"                        // 5
    "routes:\n"                                                         // 6
    "  - name: r\n"                                                     // 7
    "    match: { path_prefix: / }\n"                                   // 8
    "    upstream: app\n";                                              // 9

/// `text` loaded as the file `t.yaml`; throws config::ConfigError like the loader.
inline std::shared_ptr<const config::Config> load_config_text(const std::string& text) {
  return config::load_config_from_string(text, "t.yaml");
}

/// The loader's exact `t.yaml:LINE: key: problem` text for `text`, or "loaded" when it is
/// accepted.
inline std::string config_error_of(const std::string& text) {
  try {
    load_config_text(text);
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "loaded";
}

}  // namespace idemgate::test
