#pragma once
// The loader's shared part (private to gateway/config): document positions (Field), checked
// mappings (Map), scalar parsers, and the key tables each section is written as. A section file
// (section_*.cpp) owns one top-level section: its table names every key it accepts with type,
// default, range, SPEC case and one line of documentation, and the same table both validates
// the document and renders the key list of conf/REFERENCE.md (reference.hpp).

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/config/config_loader.hpp"

namespace idemgate::config::detail {

/// Whether `path` names something other than a regular file (a directory, a device, a FIFO);
/// false when it does not exist. Asked before opening: a directory opens as a stream and fails
/// only at its first read, a device may never end, and opening a FIFO waits for a writer.
bool is_special_file(const std::filesystem::path& path);

inline constexpr std::uint64_t KiB = 1024;
inline constexpr std::uint64_t MiB = 1024 * KiB;
inline constexpr std::uint64_t GiB = 1024 * MiB;

/// A value of the document with the dotted path and 1-based line it is reported under.
struct Field {
  YAML::Node node;
  std::string path;
  int line = 1;
};

std::string join(const std::string& path, std::string_view key);
std::string in_quotes(std::string_view s);
std::string describe(const YAML::Node& n);
std::string format_duration(Duration d);
std::string format_size(std::uint64_t n);
bool is_digit(char c);
/// RFC 9110 §5.6.2 token (field names, methods).
bool is_token(std::string_view s);
bool iequals(std::string_view a, std::string_view b);
std::string to_lower(std::string s);
/// Route and upstream names: 1-64 letters, digits, '.', '_', '-' (metrics labels, logs, scope).
bool is_name(std::string_view s);
bool is_hostname(std::string_view s);
bool is_ipv6(std::string_view s);

template <class T>
struct Choice {
  std::string_view name;
  T value;
};

class Loader;

/// A mapping of the document: checked for non-scalar, duplicate and unknown keys on
/// construction. `allowed` empty: any key (the names of `upstreams`).
class Map {
 public:
  Map(const Loader& loader, const Field& self, const std::vector<std::string_view>& allowed);
  Map(const Loader& loader, const Field& self, std::initializer_list<std::string_view> allowed)
      : Map(loader, self, std::vector<std::string_view>(allowed)) {}

  std::optional<Field> get(std::string_view key) const;
  Field require(std::string_view key) const;
  const Field& self() const { return self_; }
  const std::vector<std::pair<std::string, Field>>& entries() const { return entries_; }

 private:
  const Loader& loader_;
  Field self_;
  std::vector<std::pair<std::string, Field>> entries_;
};

/// One load of one document: where errors and warnings go, and the scalar parsers every section
/// uses. Each parser throws ConfigError naming the field when the value is out of its range.
class Loader {
 public:
  Loader(std::string file, std::filesystem::path base_dir)
      : file_(std::move(file)), base_dir_(std::move(base_dir)) {}

  std::shared_ptr<Config> load(const std::string& text);

  [[noreturn]] void fail(int line, const std::string& path, const std::string& problem) const {
    throw ConfigError(file_, line, path.empty() ? "(root)" : path, problem);
  }
  [[noreturn]] void fail(const Field& f, const std::string& problem) const {
    fail(f.line, f.path, problem);
  }
  void warn(const Field& f, const std::string& message);

  Config& config() { return *config_; }

  std::string scalar(const Field& f) const;
  std::string non_empty(const Field& f) const;
  std::int64_t integer(const Field& f, std::int64_t min, std::int64_t max) const;
  std::uint16_t port(const Field& f, bool allow_zero) const;
  Duration duration(const Field& f, Duration min, Duration max) const;
  std::uint64_t size(const Field& f, std::uint64_t min, std::uint64_t max) const;
  bool boolean(const Field& f) const { return choice<bool>(f, {{"true", true}, {"false", false}}); }
  template <class T>
  T choice(const Field& f, std::initializer_list<Choice<T>> choices) const;
  std::vector<Field> sequence(const Field& f) const;
  /// A list of distinct (case-insensitive) RFC 9110 tokens; `what` names one in messages.
  std::vector<std::string> tokens(const Field& f, std::string_view what, bool allow_empty) const;
  /// A file name resolved against the config file's directory: a regular file (or a link to
  /// one), readable now.
  std::string readable_file(const Field& f) const;
  /// readable_file(f) and the bytes it holds; fails when it holds more than `max_bytes`.
  struct FileContents {
    std::string path;
    std::string bytes;
  };
  FileContents file_contents(const Field& f, std::size_t max_bytes) const;
  /// What a PEM file given as `f` must hold (checked with OpenSSL's PEM reader, as the TLS
  /// context that loads it later reads it).
  enum class Pem { certificate, private_key };
  /// readable_file(f), which must hold at least one PEM block of `kind`.
  std::string pem_file(const Field& f, Pem kind) const;
  std::string ip_address(const Field& f) const;
  /// `"host:port"` (IPv6 as `"[::1]:9001"`).
  Server server(const Field& f) const;

 private:
  std::string file_;
  std::filesystem::path base_dir_;
  std::shared_ptr<Config> config_;
};

template <class T>
T Loader::choice(const Field& f, std::initializer_list<Choice<T>> choices) const {
  // Plain scalar text: YAML 1.1 booleans such as `off` arrive as the word itself (SPEC §2).
  const std::string s = scalar(f);
  std::string names;
  for (const auto& c : choices) {
    if (c.name == s) return c.value;
    names += names.empty() ? "" : " | ";
    names += c.name;
  }
  fail(f, "expected one of " + names + ", got " + in_quotes(s));
}

// ---- key tables ----------------------------------------------------------------------------

/// What conf/REFERENCE.md says about one key. `name` is dotted below its section
/// (`max_request_body`, `tls.cert`); markdown is allowed in every text.
struct KeyDoc {
  std::string name;
  std::string type;
  std::string default_value;
  std::string range;
  std::string serves;  ///< SPEC case(s), may be empty
  std::string doc;     ///< one line
};

/// One key of a section whose values land in an `S`. `read` validates a present value and stores
/// it; empty when the section's own code reads the key (cross-key rules, nested mappings).
template <class S>
struct Key {
  KeyDoc doc;
  std::function<void(Loader&, const Field&, S&)> read;
};

template <class S>
using KeyTable = std::vector<Key<S>>;

/// The mapping keys a table accepts below `prefix` ("" for the table's own level; "tls" for the
/// keys of `tls`), in table order: the part of each name up to the next dot, each once.
template <class S>
std::vector<std::string_view> names_of(const KeyTable<S>& table, std::string_view prefix = {}) {
  std::vector<std::string_view> out;
  for (const auto& key : table) {
    std::string_view name = key.doc.name;
    if (!prefix.empty()) {
      if (name.size() <= prefix.size() + 1 || name.substr(0, prefix.size()) != prefix ||
          name[prefix.size()] != '.') {
        continue;
      }
      name.remove_prefix(prefix.size() + 1);
    }
    name = name.substr(0, name.find('.'));
    bool seen = false;
    for (auto n : out) seen = seen || n == name;
    if (!seen) out.push_back(name);
  }
  return out;
}

/// Reads, in table order, every key of `table` that has a reader and is present in `m`.
template <class S>
void read_keys(Loader& loader, const Map& m, const KeyTable<S>& table, S& out) {
  for (const auto& key : table) {
    if (!key.read) continue;
    if (auto v = m.get(key.doc.name)) key.read(loader, *v, out);
  }
}

template <class S>
std::vector<KeyDoc> docs_of(const KeyTable<S>& table, const std::string& prefix = {}) {
  std::vector<KeyDoc> out;
  for (const auto& key : table) {
    out.push_back(key.doc);
    out.back().name = prefix + out.back().name;
  }
  return out;
}

// Key factories: the default is rendered from `defaults`, the range from the bounds, so the
// reference shows what the code does.

template <class S>
Key<S> duration_key(std::string name, Duration S::*member, const S& defaults, Duration min,
                    Duration max, std::string serves, std::string doc) {
  return {
      {std::move(name), "duration", "`" + format_duration(defaults.*member) + "`",
       format_duration(min) + " – " + format_duration(max), std::move(serves), std::move(doc)},
      [member, min, max](Loader& l, const Field& f, S& s) { s.*member = l.duration(f, min, max); }};
}

template <class S>
Key<S> size_key(std::string name, std::size_t S::*member, const S& defaults, std::uint64_t min,
                std::uint64_t max, std::string serves, std::string doc) {
  return {{std::move(name), "size", "`" + format_size(defaults.*member) + "`",
           format_size(min) + " – " + format_size(max), std::move(serves), std::move(doc)},
          [member, min, max](Loader& l, const Field& f, S& s) {
            s.*member = static_cast<std::size_t>(l.size(f, min, max));
          }};
}

template <class S, class T>
Key<S> integer_key(std::string name, T S::*member, const S& defaults, std::int64_t min,
                   std::int64_t max, std::string serves, std::string doc) {
  return {{std::move(name), "integer", "`" + std::to_string(defaults.*member) + "`",
           std::to_string(min) + " – " + std::to_string(max), std::move(serves), std::move(doc)},
          [member, min, max](Loader& l, const Field& f, S& s) {
            s.*member = static_cast<T>(l.integer(f, min, max));
          }};
}

template <class S>
Key<S> boolean_key(std::string name, bool S::*member, const S& defaults, std::string serves,
                   std::string doc) {
  return {{std::move(name), "boolean", defaults.*member ? "`true`" : "`false`",
           "`true` \\| `false`", std::move(serves), std::move(doc)},
          [member](Loader& l, const Field& f, S& s) { s.*member = l.boolean(f); }};
}

template <class S, class T>
Key<S> enum_key(std::string name, T S::*member, const S& defaults, std::vector<Choice<T>> choices,
                std::string serves, std::string doc) {
  std::string range;
  std::string default_value;
  for (const auto& c : choices) {
    range += (range.empty() ? "`" : " \\| `") + std::string(c.name) + "`";
    if (c.value == defaults.*member) default_value = "`" + std::string(c.name) + "`";
  }
  return {{std::move(name), "enum", default_value, range, std::move(serves), std::move(doc)},
          [member, choices](Loader& l, const Field& f, S& s) {
            const std::string v = l.scalar(f);
            for (const auto& c : choices) {
              if (c.name == v) {
                s.*member = c.value;
                return;
              }
            }
            std::string names;
            for (const auto& c : choices)
              names += (names.empty() ? "" : " | ") + std::string(c.name);
            l.fail(f, "expected one of " + names + ", got " + in_quotes(v));
          }};
}

/// A key the section reads itself; the texts are documentation only.
template <class S>
Key<S> custom_key(std::string name, std::string type, std::string default_value, std::string range,
                  std::string serves, std::string doc) {
  return {{std::move(name), std::move(type), std::move(default_value), std::move(range),
           std::move(serves), std::move(doc)},
          {}};
}

// ---- sections (one file each) ----------------------------------------------------------------

/// section_listen.cpp: the top-level keys, `listen`, `admin`, `threads`, `limits`, `request_id`.
const KeyTable<Config>& top_keys();
const KeyTable<Listen>& listen_keys();
const KeyTable<Listen>& admin_keys();
const KeyTable<Limits>& limits_keys();
const KeyTable<RequestId>& request_id_keys();
void read_listen(Loader& loader, const Field& f, Listen& out, bool is_admin);
void read_limits(Loader& loader, const Field& f, Limits& out);
void read_request_id(Loader& loader, const Field& f, RequestId& out);

/// section_storage.cpp: `storage` (postgres, redis, cleanup).
const KeyTable<Postgres>& postgres_keys();
const KeyTable<Redis>& redis_keys();
const KeyTable<Cleanup>& cleanup_keys();
void read_storage(Loader& loader, const Field& f);

/// section_upstreams.cpp: `upstreams.NAME`.
const KeyTable<Upstream>& upstream_keys();
void read_upstreams(Loader& loader, const Field& f);

/// section_routes.cpp: `routes[]` and their `match`.
const KeyTable<Route>& route_keys();

/// section_cors.cpp: `routes[].cors`.
const KeyTable<Cors>& cors_keys();
void read_cors(Loader& loader, const Field& f, Route& route);
void read_routes(Loader& loader, const Field& f);

/// section_idempotency.cpp: `routes[].idempotency`.
const KeyTable<Idempotency>& idempotency_keys();
void read_idempotency(Loader& loader, const Field& f, Route& route);
/// section_key.cpp: `key_headers`, `key_source`, `key_format` of the idempotency mapping `m`
/// fills `key_headers`, `key_source`, `key` and `upstream_key_applies`.
void read_key_settings(Loader& loader, const Map& m, Idempotency& idem);

}  // namespace idemgate::config::detail
