#pragma once
// Loading and validating the YAML configuration (SPEC §2; every key in conf/REFERENCE.md).

#include <memory>
#include <stdexcept>
#include <string>

#include "gateway/config/config.hpp"

namespace idemgate::config {

/// A configuration that cannot be used. `what()` is exactly `FILE:LINE: key.path: problem`
/// (SPEC §1, `idemgate check-config`): FILE as passed to the loader, LINE 1-based, key.path dotted
/// with list indices (`routes[0].idempotency.ttl`). Errors without a key use a parenthesised
/// pseudo-key: `(file)` when the file cannot be read, `(syntax)` for YAML syntax errors, `(root)`
/// for a document that is not a mapping.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string file, int line, std::string key, std::string problem);

  const std::string& file() const noexcept { return file_; }
  /// 1-based line of the offending key or value.
  int line() const noexcept { return line_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string file_;
  int line_;
  std::string key_;
  std::string problem_;
};

/// Reads, parses and validates the file at `path`. Every field of the result is in range and
/// defaults are filled in (SPEC §2); `threads` is resolved to ≥ 1; relative file names inside the
/// config (`upstream_key_secret_file`, `listen.tls`) are resolved against the config file's
/// directory, and `upstream_key_secret` is read when `upstream_key: rewrite`. Non-fatal findings
/// (e.g. a `ttl` outside 24h–72h, seed R-DIST-IDEM-5) go to `Config::warnings`.
///
/// Throws ConfigError on the first problem. Blocking file I/O: call at start-up or from a
/// reload thread, never on an io thread. Thread-safe (no shared state).
std::shared_ptr<const Config> load_config(const std::string& path);

/// As load_config, for YAML text already in memory. `name` stands for the file: it prefixes
/// errors and warnings, and its directory is the base for relative file names in the text.
std::shared_ptr<const Config> load_config_from_string(const std::string& text,
                                                      const std::string& name);

}  // namespace idemgate::config
