#include "gateway/config/config_loader.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

namespace idemgate::config {

ConfigError::ConfigError(std::string file, int line, std::string key, std::string problem)
    : std::runtime_error(file + ":" + std::to_string(line) + ": " + key + ": " + problem),
      file_(std::move(file)),
      line_(line),
      key_(std::move(key)),
      problem_(std::move(problem)) {}

namespace {

/// Parser events that only note where the root node of a stream's second document starts.
class DocumentCounter final : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> second_start() const { return second_; }
  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (documents_ == 2 && !second_) second_ = mark;
  }
  int documents_ = 0;
  std::optional<YAML::Mark> second_;
};

using namespace std::chrono_literals;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;

// A value of the document with the dotted path and 1-based line it is reported under.
struct Field {
  YAML::Node node;
  std::string path;
  int line = 1;
};

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

std::string list_text(std::initializer_list<std::string_view> items, std::string_view sep) {
  std::string out;
  for (std::string_view s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "got an empty value";
    case YAML::NodeType::Sequence:
      return "got a list";
    case YAML::NodeType::Map:
      return "got a mapping";
    case YAML::NodeType::Scalar:
      return "got " + in_quotes(n.Scalar());
    default:
      return "got nothing";
  }
}

std::string format_duration(Duration d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

std::string format_size(std::uint64_t n) {
  if (n != 0 && n % GiB == 0) return std::to_string(n / GiB) + "GiB";
  if (n != 0 && n % MiB == 0) return std::to_string(n / MiB) + "MiB";
  if (n != 0 && n % KiB == 0) return std::to_string(n / KiB) + "KiB";
  return std::to_string(n) + "B";
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// RFC 9110 §5.6.2 token (field names, methods).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return is_alpha(c) || is_digit(c) ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

std::string to_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return s;
}

// Names appear in metrics labels, logs and the scope hash: keep them plain.
bool is_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-';
  });
}

bool is_hostname(std::string_view s) {
  return !s.empty() && s.size() <= 253 && std::all_of(s.begin(), s.end(), [](char c) {
    return is_alpha(c) || is_digit(c) || c == '.' || c == '-' || c == '_';
  });
}

bool is_ipv6(std::string_view s) {
  boost::system::error_code ec;
  boost::asio::ip::make_address_v6(std::string(s), ec);
  return !ec;
}

// RFC 6901: "" or a sequence of "/" reference-token, where "~" is only followed by 0 or 1.
std::optional<std::string> json_pointer_problem(std::string_view p) {
  if (p.empty()) return "must not be empty: the whole body cannot be the key";
  if (p.front() != '/') return "must start with \"/\" (RFC 6901), e.g. \"/event_id\"";
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '~' && (i + 1 == p.size() || (p[i + 1] != '0' && p[i + 1] != '1'))) {
      return "\"~\" must be followed by 0 or 1 (RFC 6901 escapes ~0 and ~1)";
    }
  }
  return std::nullopt;
}

// Fields the gateway sets, strips or reads itself, and credentials: a generated request id
// written over any of them would break the request.
constexpr std::string_view kNotRequestIdFields[] = {
    // hop-by-hop (SPEC C02)
    "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    "Proxy-Authorization", "Proxy-Authenticate",
    // set or read by the proxy
    "Host", "Content-Length", "Content-Type", "Content-Encoding", "Expect", "Date", "Via",
    "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "traceparent", "tracestate",
    // credentials and the contract's own fields
    "Authorization", "Cookie", "Set-Cookie", "Idempotency-Key", "Idempotent-Replayed",
    "Idempotent-Body-Omitted", "Idempotency-Status"};

template <class T>
struct Choice {
  std::string_view name;
  T value;
};

class Loader;

// A mapping of the document: checked for non-scalar, duplicate and unknown keys on construction.
class Map {
 public:
  // `allowed` empty: any key (the names of `upstreams`).
  Map(const Loader& loader, const Field& self, std::initializer_list<std::string_view> allowed);

  std::optional<Field> get(std::string_view key) const;
  Field require(std::string_view key) const;
  const Field& self() const { return self_; }
  const std::vector<std::pair<std::string, Field>>& entries() const { return entries_; }

 private:
  const Loader& loader_;
  Field self_;
  std::vector<std::pair<std::string, Field>> entries_;
};

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

 private:
  void warn(const Field& f, const std::string& message) {
    config_->warnings.push_back(file_ + ":" + std::to_string(f.line) + ": " + f.path + ": " +
                                message);
  }

  // Scalars.
  std::string scalar(const Field& f) const;
  std::string non_empty(const Field& f) const;
  std::int64_t integer(const Field& f, std::int64_t min, std::int64_t max) const;
  std::uint16_t port(const Field& f, bool allow_zero) const;
  Duration duration(const Field& f, Duration min, Duration max) const;
  std::uint64_t size(const Field& f, std::uint64_t min, std::uint64_t max) const;
  template <class T>
  T choice(const Field& f, std::initializer_list<Choice<T>> choices) const;
  std::vector<Field> sequence(const Field& f) const;
  std::vector<std::string> tokens(const Field& f, std::string_view what, bool allow_empty) const;
  std::string readable_file(const Field& f) const;
  std::string ip_address(const Field& f) const;

  // Sections.
  void listen(const Field& f, Listen& out, bool is_admin);
  void limits(const Field& f);
  void request_id(const Field& f);
  void storage(const Field& f);
  void upstreams(const Field& f);
  Server server(const Field& f) const;
  void routes(const Field& f);
  void match(const Field& f, Match& out);
  void idempotency(const Field& f, Route& route);
  void key_source(const Field& f, KeySource& out);
  void read_secret(const Field& f, Idempotency& out);

  std::string file_;
  std::filesystem::path base_dir_;
  std::shared_ptr<Config> config_;
};

Map::Map(const Loader& loader, const Field& self, std::initializer_list<std::string_view> allowed)
    : loader_(loader), self_(self) {
  if (!self.node.IsMap()) loader.fail(self, "expected a mapping, " + describe(self.node));
  for (auto it = self.node.begin(); it != self.node.end(); ++it) {
    // Copies: the iterator hands out a proxy that dies with the expression.
    const YAML::Node key = it->first;
    const int key_line = key.Mark().line + 1;
    if (!key.IsScalar()) loader.fail(key_line, self.path, "a key must be a plain name");
    const std::string name = key.Scalar();
    const std::string path = join(self.path, name);
    for (const auto& [seen, field] : entries_) {
      if (seen == name) {
        loader.fail(key_line, path,
                    "duplicate key (first at line " + std::to_string(field.line) + ")");
      }
    }
    if (allowed.size() != 0 && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      loader.fail(key_line, path,
                  "unknown key (expected one of: " + list_text(allowed, ", ") + ")");
    }
    // A scalar is reported where it stands. A mapping or list is reported on its key's line, where
    // a reader looks for it; an empty value's mark would point at the next token anyway.
    const YAML::Node value = it->second;
    const int line = value.IsScalar() && !value.Mark().is_null() ? value.Mark().line + 1 : key_line;
    entries_.emplace_back(name, Field{value, path, line});
  }
}

std::optional<Field> Map::get(std::string_view key) const {
  for (const auto& [name, field] : entries_) {
    if (name == key) return field;
  }
  return std::nullopt;
}

Field Map::require(std::string_view key) const {
  auto f = get(key);
  if (!f) loader_.fail(self_.line, join(self_.path, key), "required key is missing");
  return *f;
}

std::string Loader::scalar(const Field& f) const {
  if (!f.node.IsScalar()) fail(f, "expected a single value, " + describe(f.node));
  return f.node.Scalar();
}

std::string Loader::non_empty(const Field& f) const {
  std::string s = scalar(f);
  if (s.empty()) fail(f, "must not be empty");
  return s;
}

std::int64_t Loader::integer(const Field& f, std::int64_t min, std::int64_t max) const {
  const std::string s = scalar(f);
  std::size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  if (i == s.size() || s.size() - i > 18 ||
      !std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(), is_digit)) {
    fail(f, "expected an integer, " + describe(f.node));
  }
  const std::int64_t v = std::stoll(s);
  if (v < min || v > max) {
    fail(f,
         "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + s);
  }
  return v;
}

std::uint16_t Loader::port(const Field& f, bool allow_zero) const {
  return static_cast<std::uint16_t>(integer(f, allow_zero ? 0 : 1, 65535));
}

Duration Loader::duration(const Field& f, Duration min, Duration max) const {
  const std::string s = scalar(f);
  std::size_t i = 0;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i == 0) {
    fail(f, "expected a duration like \"250ms\", \"30s\", \"10m\" or \"48h\", " + describe(f.node));
  }
  const std::string unit = s.substr(i);
  if (unit.empty()) {
    fail(f, "a bare number is not a duration: write the unit, e.g. " + in_quotes(s + "s") +
                " (units: ms, s, m, h)");
  }
  std::int64_t per_unit = 0;
  if (unit == "ms") {
    per_unit = 1;
  } else if (unit == "s") {
    per_unit = 1000;
  } else if (unit == "m") {
    per_unit = 60'000;
  } else if (unit == "h") {
    per_unit = 3'600'000;
  } else if (unit.front() == '.') {
    fail(f, "fractions are not supported: use a smaller unit, e.g. \"1500ms\"");
  } else {
    fail(f, "unknown unit " + in_quotes(unit) + " in " + in_quotes(s) + " (units: ms, s, m, h)");
  }
  // 12 digits times an hour in ms stays far below INT64_MAX.
  const Duration d{i > 12 ? max.count() + 1 : std::stoll(s.substr(0, i)) * per_unit};
  if (d < min || d > max) {
    fail(f,
         "must be between " + format_duration(min) + " and " + format_duration(max) + ", got " + s);
  }
  return d;
}

std::uint64_t Loader::size(const Field& f, std::uint64_t min, std::uint64_t max) const {
  const std::string s = scalar(f);
  std::size_t i = 0;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i == 0) fail(f, "expected a size like \"512KiB\", \"8MiB\" or bytes, " + describe(f.node));
  const std::string unit = s.substr(i);
  std::uint64_t per_unit = 0;
  if (unit.empty() || unit == "B") {
    per_unit = 1;
  } else if (unit == "KiB") {
    per_unit = KiB;
  } else if (unit == "MiB") {
    per_unit = MiB;
  } else if (unit == "GiB") {
    per_unit = GiB;
  } else {
    fail(f, "unknown unit " + in_quotes(unit) + " in " + in_quotes(s) +
                " (units: B, KiB, MiB, GiB; powers of 1024)");
  }
  // Up to 12 digits fit before the multiplication; the bound check keeps it from overflowing.
  const std::uint64_t count = i > 12 ? max : std::stoull(s.substr(0, i));
  const std::uint64_t n = (i > 12 || count > max / per_unit) ? max + 1 : count * per_unit;
  if (n < min || n > max) {
    fail(f, "must be between " + format_size(min) + " and " + format_size(max) + ", got " + s);
  }
  return n;
}

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

std::vector<Field> Loader::sequence(const Field& f) const {
  if (!f.node.IsSequence()) fail(f, "expected a list, " + describe(f.node));
  std::vector<Field> items;
  for (std::size_t i = 0; i < f.node.size(); ++i) {
    const YAML::Node item = f.node[i];
    const int line = item.Mark().is_null() ? f.line : item.Mark().line + 1;
    items.push_back(Field{item, f.path + "[" + std::to_string(i) + "]", line});
  }
  return items;
}

std::vector<std::string> Loader::tokens(const Field& f, std::string_view what,
                                        bool allow_empty) const {
  std::vector<std::string> out;
  const auto items = sequence(f);
  if (items.empty() && !allow_empty) fail(f, "must not be empty");
  for (const Field& item : items) {
    std::string s = scalar(item);
    if (!is_token(s)) fail(item, in_quotes(s) + " is not a valid " + std::string(what));
    for (const auto& seen : out) {
      if (iequals(seen, s)) fail(item, "duplicate " + std::string(what) + " " + in_quotes(s));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string Loader::readable_file(const Field& f) const {
  const std::filesystem::path given(non_empty(f));
  const std::filesystem::path p =
      given.is_absolute() || base_dir_.empty() ? given : (base_dir_ / given).lexically_normal();
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(f, "cannot read " + in_quotes(p.string()) + ": " + std::strerror(errno));
  return p.string();
}

std::string Loader::ip_address(const Field& f) const {
  std::string s = non_empty(f);
  if (s.size() > 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(s, ec);
  if (ec) fail(f, "expected an IP address such as 127.0.0.1, 0.0.0.0 or ::1, " + describe(f.node));
  return addr.to_string();
}

std::shared_ptr<Config> Loader::load(const std::string& text) {
  // Not YAML::LoadAll: yaml-cpp 0.7 yields empty documents without end, allocating for each,
  // when a ',' stands where a document's root node should start (`{listen: …},`, a lone `,`).
  // The first document is loaded; the stream is only parsed far enough to see a second one.
  std::vector<YAML::Node> docs;
  std::optional<YAML::Mark> second;
  try {
    docs.push_back(YAML::Load(text));
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter counter;
    if (parser.HandleNextDocument(counter) && parser.HandleNextDocument(counter)) {
      second = counter.second_start();
    }
  } catch (const YAML::Exception& e) {
    fail(e.mark.is_null() ? 1 : e.mark.line + 1, "(syntax)", e.msg);
  }
  if (docs.empty() || docs[0].IsNull()) {
    fail(1, "",
         "the document is empty; expected a mapping with listen, storage, upstreams, routes");
  }
  if (second) fail(second->line + 1, "", "expected one YAML document, found more");

  config_ = std::make_shared<Config>();
  config_->source_file = file_;
  const Field root{docs[0], "", docs[0].Mark().line + 1};
  const Map top(
      *this, root,
      {"listen", "admin", "threads", "limits", "request_id", "storage", "upstreams", "routes"});

  const Field listen_field = top.require("listen");
  listen(listen_field, config_->listen, false);
  const auto admin_field = top.get("admin");
  if (admin_field) listen(*admin_field, config_->admin, true);
  {
    const Listen& l = config_->listen;
    const Listen& a = config_->admin;
    auto wildcard = [](const std::string& addr) { return addr == "0.0.0.0" || addr == "::"; };
    if (l.port != 0 && l.port == a.port &&
        (l.address == a.address || wildcard(l.address) || wildcard(a.address))) {
      const Field& where = admin_field ? *admin_field : listen_field;
      fail(where.line, join(where.path, "port"),
           "listen and admin use the same port " + std::to_string(l.port));
    }
  }

  if (auto f = top.get("threads")) {
    config_->threads = static_cast<int>(integer(*f, 0, 256));
  }
  if (config_->threads == 0) {
    config_->threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (auto f = top.get("limits")) limits(*f);
  // Before routes: a route's key must not come from a generated request id.
  if (auto f = top.get("request_id")) request_id(*f);
  storage(top.require("storage"));
  upstreams(top.require("upstreams"));
  routes(top.require("routes"));
  return config_;
}

void Loader::listen(const Field& f, Listen& out, bool is_admin) {
  const Map m =
      is_admin ? Map(*this, f, {"address", "port"}) : Map(*this, f, {"address", "port", "tls"});
  if (auto a = m.get("address")) out.address = ip_address(*a);
  // The public listener's port is required: a gateway that silently takes 8080 surprises.
  if (is_admin) {
    if (auto p = m.get("port")) out.port = port(*p, true);
  } else {
    out.port = port(m.require("port"), true);
  }
  if (auto t = m.get("tls")) {
    const Map tls(*this, *t, {"cert", "key"});
    out.tls_cert = readable_file(tls.require("cert"));
    out.tls_key = readable_file(tls.require("key"));
  }
}

void Loader::limits(const Field& f) {
  const Map m(*this, f,
              {"max_request_body", "max_header_bytes", "header_read_timeout", "idle_timeout",
               "drain_timeout", "stream_buffer", "max_streamed_body", "tunnel_idle_timeout"});
  Limits& l = config_->limits;
  if (auto v = m.get("max_request_body")) l.max_request_body = size(*v, 0, GiB);
  if (auto v = m.get("max_header_bytes")) l.max_header_bytes = size(*v, KiB, MiB);
  if (auto v = m.get("header_read_timeout")) l.header_read_timeout = duration(*v, 10ms, 10min);
  if (auto v = m.get("idle_timeout")) l.idle_timeout = duration(*v, 10ms, 24h);
  if (auto v = m.get("drain_timeout")) l.drain_timeout = duration(*v, 0ms, 10min);
  if (auto v = m.get("stream_buffer")) l.stream_buffer = size(*v, KiB, 16 * MiB);
  if (auto v = m.get("max_streamed_body")) l.max_streamed_body = size(*v, 1, 1024 * GiB);
  if (auto v = m.get("tunnel_idle_timeout")) l.tunnel_idle_timeout = duration(*v, 10ms, 24h);
}

void Loader::request_id(const Field& f) {
  const Map m(*this, f, {"header", "generate"});
  RequestId& r = config_->request_id;
  if (auto v = m.get("header")) {
    r.header = non_empty(*v);
    if (!is_token(r.header)) fail(*v, in_quotes(r.header) + " is not a valid header name");
    for (std::string_view reserved : kNotRequestIdFields) {
      if (iequals(r.header, reserved)) {
        fail(*v, in_quotes(r.header) +
                     " is a field the gateway or the idempotency contract already uses; choose "
                     "another name, e.g. X-Request-Id");
      }
    }
  }
  if (auto v = m.get("generate")) r.generate = choice<bool>(*v, {{"true", true}, {"false", false}});
}

void Loader::storage(const Field& f) {
  const Map m(*this, f, {"postgres", "redis", "cleanup"});
  Storage& s = config_->storage;

  const Field pg_field = m.require("postgres");
  const Map pg(*this, pg_field, {"dsn", "pool_size", "operation_timeout", "prepared_statements"});
  s.postgres.dsn = non_empty(pg.require("dsn"));
  if (auto v = pg.get("pool_size")) {
    s.postgres.pool_size = static_cast<int>(integer(*v, 1, 256));
    if (s.postgres.pool_size < config_->threads) {
      warn(*v, "pool_size " + std::to_string(s.postgres.pool_size) + " is below threads (" +
                   std::to_string(config_->threads) +
                   "): every io thread needs at least one connection of its own");
    }
  }
  if (auto v = pg.get("operation_timeout")) s.postgres.operation_timeout = duration(*v, 10ms, 60s);
  if (auto v = pg.get("prepared_statements")) {
    s.postgres.prepared_statements = choice<bool>(*v, {{"true", true}, {"false", false}});
  }

  if (auto r = m.get("redis")) {
    const Map redis(
        *this, *r,
        {"address", "port", "db", "password", "username", "operation_timeout", "sentinels",
         "master_name", "sentinel_password", "sentinel_username", "cluster", "wait_replicas"});
    // One shape only (SPEC C41, C42): a single server, sentinels, or a cluster.
    const auto address = redis.get("address");
    const auto port_field = redis.get("port");
    const auto sentinels = redis.get("sentinels");
    const auto cluster = redis.get("cluster");
    if (sentinels && cluster) {
      fail(*cluster,
           "redis.cluster and redis.sentinels are two different shapes of "
           "storage.redis: keep one of them");
    }
    if (sentinels || cluster) {
      const char* shape = sentinels ? "redis.sentinels" : "redis.cluster";
      if (address) {
        fail(*address, std::string("redis.address names a single server and cannot be combined "
                                   "with ") +
                           shape + ": keep one of them");
      }
      if (port_field) {
        fail(*port_field, std::string("redis.port belongs to redis.address and cannot be "
                                      "combined with ") +
                              shape + ": keep one of them");
      }
    }
    if (address) {
      std::string a = non_empty(*address);
      if (a.find(':') != std::string::npos ? !is_ipv6(a) : !is_hostname(a)) {
        fail(*address, "expected a host name or IP address (the port goes in redis.port), " +
                           describe(address->node));
      }
      s.redis.address = std::move(a);
    }
    if (port_field) s.redis.port = port(*port_field, false);
    if (sentinels) {
      s.redis.mode = Redis::Mode::sentinel;
      const auto items = sequence(*sentinels);
      if (items.empty()) fail(*sentinels, "at least one sentinel \"host:port\" is required");
      for (const Field& item : items) s.redis.sentinels.push_back(server(item));
      s.redis.master_name = non_empty(redis.require("master_name"));
    } else {
      for (const char* key : {"master_name", "sentinel_password", "sentinel_username"}) {
        if (auto v = redis.get(key)) {
          fail(*v, std::string("redis.") + key + " needs redis.sentinels (the Sentinel shape)");
        }
      }
    }
    if (cluster) {
      s.redis.mode = Redis::Mode::cluster;
      const auto items = sequence(*cluster);
      if (items.empty()) fail(*cluster, "at least one cluster node \"host:port\" is required");
      for (const Field& item : items) s.redis.cluster.push_back(server(item));
    }
    if (auto v = redis.get("db")) {
      s.redis.db = static_cast<int>(integer(*v, 0, std::numeric_limits<int>::max()));
      if (cluster && s.redis.db != 0) {
        fail(*v, "a Redis Cluster has only db 0: remove redis.db or set it to 0");
      }
    }
    if (auto v = redis.get("password")) s.redis.password = scalar(*v);
    if (auto v = redis.get("username")) {
      s.redis.username = scalar(*v);
      // An ACL user authenticates with both (AUTH username password, Redis >= 6).
      if (!s.redis.username.empty() && s.redis.password.empty()) {
        fail(*v, "an ACL username needs redis.password as well");
      }
    }
    if (auto v = redis.get("sentinel_password")) s.redis.sentinel_password = scalar(*v);
    if (auto v = redis.get("sentinel_username")) {
      s.redis.sentinel_username = scalar(*v);
      if (!s.redis.sentinel_username.empty() && s.redis.sentinel_password.empty()) {
        fail(*v, "an ACL sentinel_username needs redis.sentinel_password as well");
      }
    }
    if (auto v = redis.get("wait_replicas")) {
      s.redis.wait_replicas = static_cast<int>(integer(*v, 0, 16));
    }
    if (auto v = redis.get("operation_timeout"))
      s.redis.operation_timeout = duration(*v, 10ms, 60s);
  }

  if (auto c = m.get("cleanup")) {
    const Map cleanup(*this, *c, {"interval", "batch"});
    if (auto v = cleanup.get("interval")) s.cleanup.interval = duration(*v, 1s, 24h);
    if (auto v = cleanup.get("batch"))
      s.cleanup.batch = static_cast<int>(integer(*v, 1, 1'000'000));
  }
}

void Loader::upstreams(const Field& f) {
  const Map m(*this, f, {});
  if (m.entries().empty()) fail(f, "at least one upstream is required");
  for (const auto& [name, field] : m.entries()) {
    if (!is_name(name)) {
      fail(field.line, field.path, "an upstream name is 1-64 letters, digits, '.', '_' or '-'");
    }
    Upstream u;
    u.name = name;
    const Map um(*this, field,
                 {"servers", "connect_timeout", "request_timeout", "max_idle_connections",
                  "idle_timeout", "max_response_body", "tls", "tls_ca_file", "tls_server_name"});
    const Field servers = um.require("servers");
    const auto items = sequence(servers);
    if (items.empty()) fail(servers, "at least one \"host:port\" is required");
    for (const Field& item : items) u.servers.push_back(server(item));
    if (auto v = um.get("connect_timeout")) u.connect_timeout = duration(*v, 10ms, 60s);
    if (auto v = um.get("request_timeout")) u.request_timeout = duration(*v, 10ms, 1h);
    if (auto v = um.get("max_idle_connections")) {
      u.max_idle_connections = static_cast<int>(integer(*v, 0, 10'000));
    }
    if (auto v = um.get("idle_timeout")) u.idle_timeout = duration(*v, 10ms, 1h);
    if (auto v = um.get("max_response_body")) u.max_response_body = size(*v, 1, 4 * GiB);
    if (auto v = um.get("tls")) u.tls = choice<bool>(*v, {{"true", true}, {"false", false}});
    if (auto v = um.get("tls_ca_file")) {
      if (!u.tls) fail(*v, "needs tls: true");
      u.tls_ca_file = readable_file(*v);
    }
    if (auto v = um.get("tls_server_name")) {
      if (!u.tls) fail(*v, "needs tls: true");
      u.tls_server_name = non_empty(*v);
      if (!is_hostname(u.tls_server_name) && !is_ipv6(u.tls_server_name)) {
        fail(*v,
             "expected a host name such as payments.internal, got " + in_quotes(u.tls_server_name));
      }
    }
    config_->upstreams.emplace(name, std::move(u));
  }
}

Server Loader::server(const Field& f) const {
  const std::string s = non_empty(f);
  const char* form = "expected \"host:port\" (IPv6 as \"[::1]:9001\"), got ";
  std::string host;
  std::string port_text;
  if (s.front() == '[') {
    const auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      fail(f, form + in_quotes(s));
    }
    host = s.substr(1, close - 1);
    port_text = s.substr(close + 2);
    if (!is_ipv6(host)) fail(f, in_quotes(host) + " is not an IPv6 address");
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string::npos) fail(f, form + in_quotes(s));
    if (s.find(':') != colon) {
      fail(f, "an IPv6 address goes in brackets, e.g. \"[::1]:9001\", got " + in_quotes(s));
    }
    host = s.substr(0, colon);
    port_text = s.substr(colon + 1);
    if (!is_hostname(host)) fail(f, form + in_quotes(s));
  }
  unsigned long p = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), is_digit) ||
      (p = std::stoul(port_text)) < 1 || p > 65535) {
    fail(f, "the port must be 1-65535, got " + in_quotes(s));
  }
  return Server{host, static_cast<std::uint16_t>(p)};
}

void Loader::routes(const Field& f) {
  const auto items = sequence(f);
  if (items.empty()) fail(f, "at least one route is required");
  std::vector<std::pair<std::string, int>> names;  // name, line
  for (const Field& item : items) {
    const Map m(*this, item, {"name", "match", "upstream", "idempotency", "upgrade"});
    Route route;
    const Field name = m.require("name");
    route.name = non_empty(name);
    if (!is_name(route.name)) fail(name, "a route name is 1-64 letters, digits, '.', '_' or '-'");
    for (const auto& [seen, line] : names) {
      if (seen == route.name) {
        fail(name, "duplicate route name " + in_quotes(seen) + " (first at line " +
                       std::to_string(line) + ")");
      }
    }
    names.emplace_back(route.name, name.line);

    match(m.require("match"), route.match);

    const Field upstream = m.require("upstream");
    route.upstream = non_empty(upstream);
    if (config_->upstreams.count(route.upstream) == 0) {
      std::string known;
      for (const auto& [n, u] : config_->upstreams) known += (known.empty() ? "" : ", ") + n;
      fail(upstream,
           "no upstream named " + in_quotes(route.upstream) + " (defined: " + known + ")");
    }

    if (auto v = m.get("idempotency")) idempotency(*v, route);
    if (auto v = m.get("upgrade")) {
      // SPEC C40: WebSocket is the one protocol tunnelled; h2c and the rest stay hop-by-hop.
      route.upgrade = tokens(*v, "protocol", true);
      for (auto& protocol : route.upgrade) {
        protocol = to_lower(protocol);
        if (protocol != "websocket") {
          fail(*v, "the only protocol that can be upgraded to is websocket, got " +
                       in_quotes(protocol));
        }
      }
    }
    config_->routes.push_back(std::move(route));
  }
}

void Loader::match(const Field& f, Match& out) {
  const Map m(*this, f, {"path_prefix", "path", "host", "methods"});
  auto path_value = [this](const Field& v) {
    std::string p = non_empty(v);
    if (p.front() != '/') fail(v, "must start with \"/\", got " + in_quotes(p));
    for (char c : p) {
      if (c <= ' ' || c == 0x7f || c == '?' || c == '#') {
        fail(v, "must be a plain path without spaces, query or fragment, got " + in_quotes(p));
      }
    }
    return p;
  };
  const auto prefix = m.get("path_prefix");
  const auto exact = m.get("path");
  if (prefix && exact) fail(*exact, "set either path or path_prefix, not both");
  if (!prefix && !exact) fail(f, "needs path_prefix or path (use path_prefix: / to match all)");
  if (prefix) out.path_prefix = path_value(*prefix);
  if (exact) out.path = path_value(*exact);
  if (auto h = m.get("host")) {
    std::string host = to_lower(non_empty(*h));
    const std::string_view name = std::string_view(host).substr(host.rfind("*.", 0) == 0 ? 2 : 0);
    if (!is_hostname(name) || name.front() == '.' || name.back() == '.') {
      fail(*h, "expected a host name without port, optionally \"*.\" first, got " +
                   in_quotes(h->node.Scalar()));
    }
    out.host = std::move(host);
  }
  if (auto v = m.get("methods")) out.methods = tokens(*v, "method", false);
}

void Loader::idempotency(const Field& f, Route& route) {
  const Map m(*this, f,
              {"mode",
               "methods",
               "ttl",
               "lock_ttl",
               "key_scope",
               "fingerprint",
               "upstream_key",
               "upstream_key_secret_file",
               "key_source",
               "on_mismatch",
               "concurrency",
               "wait_timeout",
               "max_waiters",
               "store_statuses",
               "max_stored_response",
               "on_unknown_outcome",
               "fingerprint_body",
               "on_store_error",
               "commit_timeout",
               "replay_cache_ttl",
               "replay_cache_max_bytes"});
  Idempotency& idem = route.idempotency;
  if (auto v = m.get("mode")) {
    idem.mode = choice<IdempotencyMode>(*v, {{"off", IdempotencyMode::off},
                                             {"optional", IdempotencyMode::optional},
                                             {"required", IdempotencyMode::required}});
  }
  const auto methods = m.get("methods");
  if (methods) idem.methods = tokens(*methods, "method", false);
  if (!route.match.methods.empty() && idem.mode != IdempotencyMode::off &&
      std::none_of(idem.methods.begin(), idem.methods.end(), [&](const std::string& x) {
        return std::find(route.match.methods.begin(), route.match.methods.end(), x) !=
               route.match.methods.end();
      })) {
    warn(methods ? *methods : f,
         "none of the idempotency methods is in match.methods: the contract never applies");
  }
  if (auto v = m.get("ttl")) {
    idem.ttl = duration(*v, 1s, 8760h);
    if (idem.ttl < 24h || idem.ttl > 72h) {
      warn(*v, "ttl " + format_duration(idem.ttl) +
                   " is outside 24h-72h: shorter lets late retries execute again, longer keeps "
                   "records past any client's retry window (seed R-DIST-IDEM-5)");
    }
  }
  const auto lock_ttl_field = m.get("lock_ttl");
  if (lock_ttl_field) idem.lock_ttl = duration(*lock_ttl_field, 1s, 10min);
  if (idem.mode != IdempotencyMode::off &&
      config_->storage.redis.operation_timeout * 3 > idem.lock_ttl) {
    warn(lock_ttl_field ? *lock_ttl_field : f,
         "lock_ttl " + format_duration(idem.lock_ttl) +
             " is under 3 x storage.redis.operation_timeout: one slow renewal can let the lock "
             "expire");
  }
  if (auto v = m.get("key_scope")) {
    const Map scope(*this, *v, {"headers"});
    if (auto h = scope.get("headers")) idem.key_scope_headers = tokens(*h, "header name", true);
  }
  if (auto v = m.get("fingerprint")) {
    const Map fp(*this, *v, {"headers"});
    if (auto h = fp.get("headers")) idem.fingerprint_headers = tokens(*h, "header name", true);
  }
  if (auto v = m.get("key_source")) {
    key_source(*v, idem.key_source);
    // A generated id is new on every request: as a key it would make each retry a new
    // operation, and a required key would never be missing.
    const RequestId& rid = config_->request_id;
    const auto& ks = idem.key_source;
    if (rid.generate &&
        (iequals(ks.header, rid.header) ||
         std::any_of(ks.headers.begin(), ks.headers.end(),
                     [&](const std::string& h) { return iequals(h, rid.header); }))) {
      fail(*v, "the key cannot come from " + rid.header +
                   ", where the gateway generates request ids; set request_id.generate: false "
                   "or take the key from another field");
    }
  }
  for (const auto* list : {&idem.key_scope_headers, &idem.fingerprint_headers}) {
    if (!config_->request_id.generate) break;
    for (const auto& h : *list) {
      if (!iequals(h, config_->request_id.header)) continue;
      warn(m.get(list == &idem.key_scope_headers ? "key_scope" : "fingerprint").value_or(f),
           h + " differs from request to request when the gateway generates it (request_id): "
               "retries of one operation would not be recognised");
    }
  }

  const auto upstream_key = m.get("upstream_key");
  if (upstream_key) {
    idem.upstream_key =
        choice<UpstreamKey>(*upstream_key, {{"passthrough", UpstreamKey::passthrough},
                                            {"rewrite", UpstreamKey::rewrite},
                                            {"strip", UpstreamKey::strip}});
  }
  const auto secret_file = m.get("upstream_key_secret_file");
  if (idem.upstream_key == UpstreamKey::rewrite) {
    if (!secret_file) {
      fail(upstream_key->line, join(f.path, "upstream_key_secret_file"),
           "required when upstream_key is rewrite");
    }
    read_secret(*secret_file, idem);
  } else if (secret_file) {
    idem.upstream_key_secret_file = non_empty(*secret_file);
  }
  const bool key_is_idempotency_key = idem.key_source.kind == KeySource::Kind::header &&
                                      iequals(idem.key_source.header, "Idempotency-Key");
  if (upstream_key && idem.upstream_key != UpstreamKey::passthrough && !key_is_idempotency_key) {
    warn(*upstream_key,
         "has no effect: upstream_key applies to the Idempotency-Key source only "
         "(SPEC C37)");
  }

  if (auto v = m.get("on_mismatch")) {
    idem.on_mismatch = choice<int>(*v, {{"422", 422}, {"409", 409}, {"400", 400}});
  }
  const auto concurrency = m.get("concurrency");
  if (concurrency) {
    idem.concurrency = choice<Concurrency>(
        *concurrency, {{"reject", Concurrency::reject}, {"wait", Concurrency::wait}});
  }
  const auto wait_timeout = m.get("wait_timeout");
  if (wait_timeout) idem.wait_timeout = duration(*wait_timeout, 10ms, 20min);
  // A held unknown outcome (C22) lapses within one lock_ttl; a waiter still blocked after two is
  // behind a slow upstream whose lock keeps being renewed, and a 409 with Retry-After serves the
  // client better than a connection held open (conf/REFERENCE.md).
  if (idem.concurrency == Concurrency::wait && idem.wait_timeout > 2 * idem.lock_ttl) {
    const std::string bound = format_duration(2 * idem.lock_ttl);
    const std::string value = format_duration(idem.wait_timeout);
    if (wait_timeout) {
      fail(*wait_timeout, "must not exceed 2 x lock_ttl (" + bound + "), got " + value);
    }
    fail(concurrency->line, join(f.path, "wait_timeout"),
         "wait_timeout " + value + " exceeds 2 x lock_ttl (" + bound + "); set wait_timeout");
  }
  // C26: how long a commit that failed after the upstream answered is retried; the client's
  // answer waits for it. 0s: one attempt.
  if (auto v = m.get("commit_timeout")) idem.commit_timeout = duration(*v, 0ms, 10min);
  // C23: the committed marker never outlives its record.
  if (auto v = m.get("replay_cache_ttl")) {
    idem.replay_cache_ttl = duration(*v, 0ms, 8760h);
    if (idem.replay_cache_ttl > idem.ttl) {
      fail(*v, "must not exceed ttl (" + format_duration(idem.ttl) + "), got " +
                   format_duration(idem.replay_cache_ttl));
    }
  } else {
    idem.replay_cache_ttl = std::min(idem.replay_cache_ttl, idem.ttl);
  }
  if (auto v = m.get("replay_cache_max_bytes")) {
    idem.replay_cache_max_bytes = size(*v, 0, 1 * MiB);
  }
  if (auto v = m.get("max_waiters")) {
    idem.max_waiters = static_cast<std::size_t>(integer(*v, 0, 10'000));
  }
  if (auto v = m.get("store_statuses")) {
    std::string error;
    auto set = core::StatusSet::parse(scalar(*v), error);
    if (!set) fail(*v, error);
    idem.store_statuses = *set;
  }
  if (auto v = m.get("max_stored_response")) idem.max_stored_response = size(*v, 0, 256 * MiB);
  if (auto v = m.get("on_unknown_outcome")) {
    idem.on_unknown_outcome = choice<UnknownOutcome>(
        *v, {{"hold", UnknownOutcome::hold}, {"release", UnknownOutcome::release}});
  }
  if (auto v = m.get("fingerprint_body")) {
    idem.fingerprint_body = choice<FingerprintBody>(
        *v, {{"bytes", FingerprintBody::bytes}, {"json", FingerprintBody::json}});
  }
  if (auto v = m.get("on_store_error")) {
    idem.on_store_error =
        choice<StoreErrorPolicy>(*v, {{"fail_closed", StoreErrorPolicy::fail_closed},
                                      {"fail_open", StoreErrorPolicy::fail_open}});
  }
}

void Loader::key_source(const Field& f, KeySource& out) {
  const Map m(*this, f, {"header", "json_pointer", "headers"});
  if (m.entries().empty()) fail(f, "needs one of header, json_pointer, headers");
  if (m.entries().size() > 1) {
    fail(m.entries()[1].second, "only one of header, json_pointer, headers may be set");
  }
  const auto& [kind, v] = m.entries().front();
  if (kind == "header") {
    out.kind = KeySource::Kind::header;
    out.header = non_empty(v);
    if (!is_token(out.header)) fail(v, in_quotes(out.header) + " is not a valid header name");
  } else if (kind == "json_pointer") {
    out.kind = KeySource::Kind::json_pointer;
    out.header.clear();
    out.json_pointer = scalar(v);
    if (auto problem = json_pointer_problem(out.json_pointer)) fail(v, *problem);
  } else {
    out.kind = KeySource::Kind::headers;
    out.header.clear();
    out.headers = tokens(v, "header name", false);
    if (out.headers.size() < 2) {
      fail(v, "needs at least two header names (one header: use key_source.header)");
    }
  }
}

void Loader::read_secret(const Field& f, Idempotency& out) {
  out.upstream_key_secret_file = readable_file(f);
  std::ifstream in(out.upstream_key_secret_file, std::ios::binary);
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(f, "cannot read " + in_quotes(out.upstream_key_secret_file));
  // Editors add a final newline; it is not part of the key.
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) fail(f, "the file " + in_quotes(out.upstream_key_secret_file) + " is empty");
  if (secret.size() < 32) {
    warn(f, "the secret has " + std::to_string(secret.size()) +
                " bytes; HMAC-SHA-256 wants at least 32 (RFC 2104 §3)");
  }
  out.upstream_key_secret = std::move(secret);
}

std::filesystem::path directory_of(const std::string& file) {
  return std::filesystem::path(file).parent_path();
}

}  // namespace

std::shared_ptr<const Config> load_config_from_string(const std::string& text,
                                                      const std::string& name) {
  Loader loader(name, directory_of(name));
  return loader.load(text);
}

std::shared_ptr<const Config> load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(path, 1, "(file)", std::string("cannot read: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path, 1, "(file)", "read error");
  return load_config_from_string(text.str(), path);
}

}  // namespace idemgate::config
