// Fuzz target for the YAML configuration loader (SPEC §2): any text either loads into a Config
// whose fields are in range, or is refused with ConfigError. Any other exception escaping
// load_config_from_string is a crash.

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/check.hpp"
#include "gateway/config/config_loader.hpp"

namespace config = idemgate::config;
using idemgate::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const config::Config> loaded;
  try {
    // A directory that does not exist: relative file names in the text resolve to nothing.
    loaded = config::load_config_from_string(text, "/nonexistent-fuzz-dir/fuzz.yaml");
  } catch (const config::ConfigError& e) {
    check(e.line() >= 1, "a ConfigError names a 1-based line");
    check(!e.key().empty(), "a ConfigError names a key");
    return 0;
  }
  check(loaded != nullptr, "a loaded config is not null");
  check(loaded->threads >= 1, "threads resolved to at least 1");
  check(!loaded->routes.empty(), "a loaded config has routes");
  for (const auto& route : loaded->routes) {
    check(loaded->upstreams.count(route.upstream) == 1, "every route names a known upstream");
  }
  return 0;
}
