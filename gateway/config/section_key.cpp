// `routes[].idempotency`: where the key comes from and what it must look like (SPEC C13, C37,
// C55, C56): `key_headers`, `key_source` and `key_format`.

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "gateway/config/loader.hpp"

namespace idemgate::config::detail {
namespace {

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

void read_key_source(Loader& loader, const Field& f, KeySource& out) {
  const Map m(loader, f, {"header", "json_pointer", "headers"});
  if (m.entries().empty()) loader.fail(f, "needs one of header, json_pointer, headers");
  if (m.entries().size() > 1) {
    loader.fail(m.entries()[1].second, "only one of header, json_pointer, headers may be set");
  }
  const auto& [kind, v] = m.entries().front();
  if (kind == "header") {
    out.kind = KeySource::Kind::header;
    out.header = loader.non_empty(v);
    if (!is_token(out.header))
      loader.fail(v, in_quotes(out.header) + " is not a valid header name");
  } else if (kind == "json_pointer") {
    out.kind = KeySource::Kind::json_pointer;
    out.header.clear();
    out.json_pointer = loader.scalar(v);
    if (auto problem = json_pointer_problem(out.json_pointer)) loader.fail(v, *problem);
  } else {
    out.kind = KeySource::Kind::headers;
    out.header.clear();
    out.headers = loader.tokens(v, "header name", false);
    if (out.headers.size() < 2) {
      loader.fail(v, "needs at least two header names (one header: use key_source.header)");
    }
  }
}

core::KeyFormat read_key_format(Loader& loader, const Field& f) {
  if (f.node.IsMap()) {
    const Map m(loader, f, {"pattern"});
    const Field pattern = m.require("pattern");
    const std::string text = loader.non_empty(pattern);
    try {
      return core::KeyFormat::pattern(text);
    } catch (const std::invalid_argument& e) {
      loader.fail(pattern, e.what());
    }
  }
  if (!f.node.IsScalar()) {
    loader.fail(f, "expected any, uuid or { pattern: REGEX }, " + describe(f.node));
  }
  const std::string word = loader.scalar(f);
  if (word == "any") return core::KeyFormat();
  if (word == "uuid") return core::KeyFormat::uuid();
  loader.fail(f, "expected any, uuid or { pattern: REGEX }, got " + in_quotes(word));
}

}  // namespace

void read_key_settings(Loader& loader, const Map& m, Idempotency& idem) {
  const auto source = m.get("key_source");
  const auto headers = m.get("key_headers");
  if (source && headers) {
    loader.fail(*headers,
                "set either key_headers or key_source, not both: key_headers lists the "
                "fields that carry the key (aliases), key_source takes it from "
                "elsewhere (key_source.header is key_headers with one field)");
  }
  core::KeySpec& key = idem.key;
  if (source) {
    read_key_source(loader, *source, idem.key_source);
    const KeySource& ks = idem.key_source;
    switch (ks.kind) {
      case KeySource::Kind::header:
        key.kind = core::KeySpec::Kind::header;
        key.fields = {ks.header};
        idem.key_headers = {ks.header};
        break;
      case KeySource::Kind::headers:
        key.kind = core::KeySpec::Kind::headers;
        key.fields = ks.headers;
        idem.key_headers.clear();
        break;
      case KeySource::Kind::json_pointer:
        key.kind = core::KeySpec::Kind::json_pointer;
        key.fields.clear();
        key.json_pointer = ks.json_pointer;
        idem.key_headers.clear();
        break;
    }
    // C37: upstream_key is about the Idempotency-Key field, not another source.
    idem.upstream_key_applies =
        ks.kind == KeySource::Kind::header && iequals(ks.header, "Idempotency-Key");
  } else if (headers) {
    idem.key_headers = loader.tokens(*headers, "header name", false);
    idem.key_source.header = idem.key_headers.front();
    key.fields = idem.key_headers;
  }
  if (auto v = m.get("key_format")) {
    key.format = read_key_format(loader, *v);
    if (key.kind == core::KeySpec::Kind::headers &&
        key.format.kind() != core::KeyFormat::Kind::any) {
      loader.fail(*v,
                  "a key joined from several headers (key_source.headers) has no single "
                  "format; use any, or key_headers for a key in one field");
    }
  }
  // A generated id is new on every request: as a key it would make each retry a new
  // operation, and a required key would never be missing.
  const RequestId& rid = loader.config().request_id;
  const auto& names = key.fields;
  if (rid.generate && std::any_of(names.begin(), names.end(),
                                  [&](const std::string& h) { return iequals(h, rid.header); })) {
    loader.fail(source ? *source : *headers,
                "the key cannot come from " + rid.header +
                    ", where the gateway generates request ids; set request_id.generate: false "
                    "or take the key from another field");
  }
}

}  // namespace idemgate::config::detail
