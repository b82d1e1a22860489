#include "gateway/http/headers.hpp"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/container/small_vector.hpp>
#include <cctype>
#include <charconv>
#include <cstring>
#include <string_view>
#include <vector>

#include "gateway/common/http_date.hpp"
#include "gateway/common/ows.hpp"

namespace idemgate::http {
namespace {

namespace bhttp = boost::beast::http;

/// Whether `field` is named `name` (case-insensitive); the lengths first.
bool has_name(const Fields::value_type& field, std::string_view name) {
  return field.name_string().size() == name.size() &&
         boost::beast::iequals(field.name_string(), name);
}

constexpr bhttp::field kHopByHop[] = {
    bhttp::field::connection,
    bhttp::field::keep_alive,
    bhttp::field::proxy_connection,
    bhttp::field::te,
    bhttp::field::trailer,
    bhttp::field::transfer_encoding,
    bhttp::field::upgrade,
    bhttp::field::proxy_authorization,
    bhttp::field::proxy_authenticate,
};

bool hop_by_hop(bhttp::field name) {
  return std::find(std::begin(kHopByHop), std::end(kHopByHop), name) != std::end(kHopByHop);
}

}  // namespace

bool has_token(const Fields& fields, std::string_view name, std::string_view token) {
  for (const auto& f : fields) {
    if (boost::beast::iequals(f.name_string(), name) &&
        bhttp::token_list(f.value()).exists(token)) {
      return true;
    }
  }
  return false;
}

bool upgrade_names(const Fields& fields, std::string_view protocol) {
  for (const auto& f : fields) {
    if (f.name() != bhttp::field::upgrade) continue;
    std::string_view rest = f.value();
    for (;;) {
      const auto comma = rest.find(',');
      const auto entry = common::trim_ows(rest.substr(0, comma));
      if (boost::beast::iequals(common::trim_ows(entry.substr(0, entry.find('/'))), protocol))
        return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return false;
}

void strip_hop_by_hop(Fields& fields) {
  // The fields named by Connection go too (the Connection field itself is among kHopByHop).
  // Host is exempt: a client naming it would otherwise make the forwarded request invalid (C02
  // keeps it). The names are copied: erasing fields frees the values the list points into.
  // (Usually one name, "keep-alive" or "close": no allocation.)
  boost::container::small_vector<std::string, 2> named;
  for (const auto& f : fields) {
    if (f.name() != bhttp::field::connection) continue;
    for (const auto& name : bhttp::token_list(f.value())) {
      if (!boost::beast::iequals(name, "Host")) named.emplace_back(name);
    }
  }
  // One pass over the fields, the listed ones known by their enum: no lookup per name.
  for (auto it = fields.begin(); it != fields.end();) {
    const bool drop = hop_by_hop(it->name()) ||
                      std::any_of(named.begin(), named.end(),
                                  [&](const std::string& name) { return has_name(*it, name); });
    it = drop ? fields.erase(it) : std::next(it);
  }
}

void append_to_list(Fields& fields, std::string_view name, std::string_view value) {
  if (find_field(fields, name) == fields.end()) {  // the usual case: the list begins here
    fields.insert(name, value);
    return;
  }
  std::string joined;
  for (const auto& f : fields) {
    if (!boost::beast::iequals(f.name_string(), name)) continue;
    const auto v = common::trim_ows(f.value());
    if (v.empty()) continue;
    if (!joined.empty()) joined += ", ";
    joined += v;
  }
  if (!joined.empty()) joined += ", ";
  joined += value;
  fields.set(name, joined);
}

Fields::const_iterator find_field(const Fields& fields, std::string_view name) {
  return std::find_if(fields.begin(), fields.end(),
                      [&](const auto& f) { return has_name(f, name); });
}

Fields::const_iterator find_next_field(const Fields& fields, Fields::const_iterator after) {
  const auto name = after->name_string();
  return std::find_if(std::next(after), fields.end(),
                      [&](const auto& f) { return has_name(f, name); });
}

Fields::const_iterator find_field(const Fields& fields, bhttp::field name) {
  return std::find_if(fields.begin(), fields.end(),
                      [&](const auto& f) { return f.name() == name; });
}

void erase_fields(Fields& fields, std::initializer_list<std::string_view> names) {
  for (auto it = fields.begin(); it != fields.end();) {
    const bool listed = std::any_of(names.begin(), names.end(),
                                    [&](std::string_view name) { return has_name(*it, name); });
    it = listed ? fields.erase(it) : std::next(it);
  }
}

void AddedFields::add(std::string_view name, std::string_view value) {
  text_.insert(text_.end(), name.begin(), name.end());
  text_.push_back(':');
  text_.push_back(' ');
  text_.insert(text_.end(), value.begin(), value.end());
  text_.push_back('\r');
  text_.push_back('\n');
}

template <class Visit>
bool AddedFields::each(Visit visit) const {
  std::string_view rest = lines();
  while (!rest.empty()) {
    const auto colon = rest.find(':');  // a field name holds no colon
    const auto end = rest.find("\r\n", colon);
    if (visit(rest.substr(0, colon), rest.substr(colon + 2, end - colon - 2))) return true;
    rest.remove_prefix(end + 2);
  }
  return false;
}

void AddedFields::insert_into(Fields& fields) const {
  each([&](std::string_view name, std::string_view value) {
    fields.insert(name, value);
    return false;
  });
}

bool AddedFields::has(std::string_view name) const {
  return each([&](std::string_view line_name, std::string_view) {
    return line_name.size() == name.size() && boost::beast::iequals(line_name, name);
  });
}

void replace_field(Fields& fields, std::string_view name, std::string_view value,
                   AddedFields& added) {
  erase_fields(fields, {name});
  added.add(name, value);
}

void append_to_list(Fields& fields, std::string_view name, std::string_view value,
                    AddedFields& added) {
  if (find_field(fields, name) == fields.end()) {
    added.add(name, value);
  } else {
    append_to_list(fields, name, value);
  }
}

void set_content_length(Fields& fields, std::uint64_t length) {
  char text[24];
  const std::string_view digits(text, std::to_chars(text, text + sizeof text, length).ptr - text);
  std::size_t count = 0;
  bool same = false;
  for (const auto& f : fields) {
    if (f.name() != bhttp::field::content_length) continue;
    ++count;
    same = f.value() == digits;
  }
  if (count == 1 && same) return;
  fields.set(bhttp::field::content_length, digits);
}

void add_forwarding_fields(Fields& fields, std::string_view client_ip, std::string_view proto,
                           AddedFields& added) {
  append_to_list(fields, "X-Forwarded-For", client_ip, added);
  replace_field(fields, "X-Forwarded-Proto", proto, added);
  if (const auto host = find_field(fields, bhttp::field::host); host != fields.end()) {
    replace_field(fields, "X-Forwarded-Host", host->value(), added);
  } else {
    erase_fields(fields, {"X-Forwarded-Host"});
  }
  append_to_list(fields, "Via", kViaEntry, added);
}

void add_forwarding_fields(Fields& fields, std::string_view client_ip, std::string_view proto) {
  AddedFields added;
  add_forwarding_fields(fields, client_ip, proto, added);
  added.insert_into(fields);
}

std::optional<std::chrono::seconds> keep_alive_timeout(const Fields& fields) {
  for (const auto& f : fields) {
    if (f.name() != bhttp::field::keep_alive) continue;
    // `timeout=5, max=100` is a comma list of parameters: with the commas turned into
    // semicolons it is what Beast's param_list reads (`;timeout=5; max=100`).
    std::string params = ";" + std::string(f.value());
    std::replace(params.begin(), params.end(), ',', ';');
    for (const auto& [name, raw] : bhttp::param_list(params)) {
      if (!boost::beast::iequals(name, "timeout")) continue;
      std::string_view value = raw;
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      long long seconds = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
      if (ec == std::errc() && ptr == value.data() + value.size() && seconds >= 0) {
        return std::chrono::seconds(seconds);
      }
    }
  }
  return std::nullopt;
}

bool status_has_body(unsigned status) {
  return !(status / 100 == 1 || status == 204 || status == 304);
}

void add_answer_fields(Fields& fields, std::string_view id_field, std::string_view request_id,
                       AddedFields& added) {
  replace_field(fields, "Date", common::http_date_now(), added);
  append_to_list(fields, "Via", kViaEntry, added);
  if (!request_id.empty()) replace_field(fields, id_field, request_id, added);
}

void finalize_answer(boost::beast::http::response<boost::beast::http::string_body>& res, bool head,
                     std::string_view id_field, std::string_view request_id) {
  strip_hop_by_hop(res.base());
  AddedFields added;
  add_answer_fields(res.base(), id_field, request_id, added);
  added.insert_into(res.base());
  if (!status_has_body(res.result_int())) {
    res.body().clear();
    res.erase(boost::beast::http::field::content_length);
  } else if (head) {
    res.body().clear();  // the Content-Length describes what a GET would have returned
  } else {
    res.content_length(res.body().size());
  }
}

bool valid_chunk_extensions(std::string_view ext) {
  // RFC 9110 §5.6.2 tchar, §5.6.4 qdtext and quoted-pair (obs-text is %x80-FF).
  const auto tchar = [](unsigned char c) {
    return std::isalnum(c) != 0 ||
           std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
  };
  const auto qdtext = [](unsigned char c) {
    return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) ||
           (c >= 0x5d && c <= 0x7e) || c >= 0x80;
  };
  const auto pair_char = [](unsigned char c) {
    return c == '\t' || c == ' ' || (c >= 0x21 && c <= 0x7e) || c >= 0x80;
  };
  std::size_t i = 0;
  const auto at = [&] { return static_cast<unsigned char>(ext[i]); };
  const auto skip_bws = [&] {
    while (i < ext.size() && (ext[i] == ' ' || ext[i] == '\t')) ++i;
  };
  const auto token = [&] {
    const std::size_t start = i;
    while (i < ext.size() && tchar(at())) ++i;
    return i > start;
  };
  for (;;) {
    skip_bws();
    if (i == ext.size()) return true;
    if (ext[i] != ';') return false;
    ++i;
    skip_bws();
    if (!token()) return false;
    const std::size_t after_name = i;
    skip_bws();
    if (i == ext.size() || ext[i] != '=') {
      i = after_name;
      continue;
    }
    ++i;
    skip_bws();
    if (i < ext.size() && ext[i] == '"') {
      for (++i;; ++i) {
        if (i == ext.size()) return false;
        if (ext[i] == '"') break;
        if (ext[i] == '\\') {
          if (++i == ext.size() || !pair_char(at())) return false;
        } else if (!qdtext(at())) {
          return false;
        }
      }
      ++i;
    } else if (!token()) {
      return false;
    }
  }
}

namespace {

/// Appends bytes to [out, out + capacity) while they fit; `full` once they did not.
struct HeadWriter {
  char* out;
  std::size_t capacity;
  std::size_t size = 0;
  bool full = false;

  void put(std::string_view bytes) {
    if (bytes.empty()) return;  // its data() may be null, which memcpy must not get
    if (full || bytes.size() > capacity - size) {
      full = true;
      return;
    }
    std::memcpy(out + size, bytes.data(), bytes.size());
    size += bytes.size();
  }
  void put_version(unsigned version) {
    const char text[] = {'H', 'T',
                         'T', 'P',
                         '/', static_cast<char>('0' + version / 10),
                         '.', static_cast<char>('0' + version % 10)};
    put({text, sizeof text});
  }
  std::size_t fields_and_end(const Fields& fields, std::string_view added) {
    for (const auto& field : fields) {
      put(field.name_string());
      put(": ");
      put(field.value());
      put("\r\n");
    }
    put(added);
    put("\r\n");
    return full ? 0 : size;
  }
};

}  // namespace

/// What Beast's obsolete_reason() gives a status it has no phrase for.
constexpr std::string_view kUnknownReason = "<unknown-status>";

std::size_t render_head(const bhttp::response_header<>& header, char* out, std::size_t capacity,
                        std::string_view added) {
  HeadWriter w{out, capacity};
  w.put_version(header.version());
  const unsigned code = header.result_int();
  const char status[] = {' ', static_cast<char>('0' + code / 100 % 10),
                         static_cast<char>('0' + code / 10 % 10),
                         static_cast<char>('0' + code % 10), ' '};
  w.put({status, sizeof status});
  // Beast's reason() falls back to the status's standard phrase, and to a placeholder for a
  // status without one: that becomes no phrase, which RFC 9112 §4 allows.
  const std::string_view reason(header.reason().data(), header.reason().size());
  if (reason != kUnknownReason) w.put(reason);
  w.put("\r\n");
  return w.fields_and_end(header, added);
}

std::size_t render_head(const bhttp::request_header<>& header, char* out, std::size_t capacity,
                        std::string_view added) {
  HeadWriter w{out, capacity};
  w.put({header.method_string().data(), header.method_string().size()});
  w.put(" ");
  w.put({header.target().data(), header.target().size()});
  w.put(" ");
  w.put_version(header.version());
  w.put("\r\n");
  return w.fields_and_end(header, added);
}

}  // namespace idemgate::http
