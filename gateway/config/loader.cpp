#include "gateway/config/loader.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <system_error>

#include "gateway/common/host_port.hpp"

namespace idemgate::config::detail {

namespace {

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string list_text(const std::vector<std::string_view>& items, std::string_view sep) {
  std::string out;
  for (std::string_view s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

}  // namespace

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
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

Map::Map(const Loader& loader, const Field& self, const std::vector<std::string_view>& allowed)
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

void Loader::warn(const Field& f, const std::string& message) {
  config_->warnings.push_back(file_ + ":" + std::to_string(f.line) + ": " + f.path + ": " +
                              message);
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

bool is_special_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  return std::filesystem::exists(status) && !std::filesystem::is_regular_file(status);
}

std::string Loader::readable_file(const Field& f) const {
  const std::filesystem::path given(non_empty(f));
  const std::filesystem::path p =
      given.is_absolute() || base_dir_.empty() ? given : (base_dir_ / given).lexically_normal();
  if (is_special_file(p)) fail(f, in_quotes(p.string()) + " is not a regular file");
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(f, "cannot read " + in_quotes(p.string()) + ": " + std::strerror(errno));
  return p.string();
}

Loader::FileContents Loader::file_contents(const Field& f, std::size_t max_bytes) const {
  FileContents out{readable_file(f), {}};
  std::ifstream in(out.path, std::ios::binary);
  out.bytes.resize(max_bytes + 1);  // one more: a file that fills it is too large
  in.read(out.bytes.data(), static_cast<std::streamsize>(out.bytes.size()));
  if (in.bad()) fail(f, "cannot read " + in_quotes(out.path));
  out.bytes.resize(static_cast<std::size_t>(in.gcount()));
  if (out.bytes.size() > max_bytes) {
    fail(f, in_quotes(out.path) + " has more than the " + std::to_string(max_bytes) +
                " bytes such a file may have");
  }
  return out;
}

std::string Loader::pem_file(const Field& f, Pem kind) const {
  constexpr std::size_t kMaxPemBytes = 1024 * 1024;
  const FileContents file = file_contents(f, kMaxPemBytes);
  const std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(file.bytes.data(), static_cast<int>(file.bytes.size())), &BIO_free);
  bool found = false;
  if (bio && kind == Pem::certificate) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    found = cert != nullptr;
    X509_free(cert);
  } else if (bio) {
    // No passphrase prompt: an encrypted key is reported as missing instead of blocking.
    EVP_PKEY* key = PEM_read_bio_PrivateKey(
        bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
    found = key != nullptr;
    EVP_PKEY_free(key);
  }
  ERR_clear_error();
  if (!found) {
    fail(f, in_quotes(file.path) + " holds no " +
                (kind == Pem::certificate ? "PEM certificate" : "unencrypted PEM private key"));
  }
  return file.path;
}

std::string Loader::ip_address(const Field& f) const {
  std::string s = non_empty(f);
  if (s.size() > 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(s, ec);
  if (ec) fail(f, "expected an IP address such as 127.0.0.1, 0.0.0.0 or ::1, " + describe(f.node));
  return addr.to_string();
}

Server Loader::server(const Field& f) const {
  const std::string s = non_empty(f);
  const auto parsed = common::parse_host_port(s);
  if (!parsed.value) {
    switch (parsed.error) {
      case common::HostPortError::ipv6_unbracketed:
        fail(f, "an IPv6 address goes in brackets, e.g. \"[::1]:9001\", got " + in_quotes(s));
      case common::HostPortError::bad_ipv6:
        fail(f, in_quotes(s.substr(1, s.find(']') - 1)) + " is not an IPv6 address");
      case common::HostPortError::bad_port:
        fail(f, "the port must be 1-65535, got " + in_quotes(s));
      case common::HostPortError::syntax:
        break;
    }
    fail(f, "expected \"host:port\" (IPv6 as \"[::1]:9001\"), got " + in_quotes(s));
  }
  // parse_host_port takes any RFC 3986 reg-name; a server is a DNS name or an address.
  const Server& server = *parsed.value;
  if (s.front() == '[' ? !is_ipv6(server.host) : !is_hostname(server.host)) {
    fail(f, "expected \"host:port\" (IPv6 as \"[::1]:9001\"), got " + in_quotes(s));
  }
  return server;
}

}  // namespace idemgate::config::detail
