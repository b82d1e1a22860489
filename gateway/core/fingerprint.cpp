#include "gateway/core/fingerprint.hpp"

#include <algorithm>
#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/serialize.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace idemgate::core {
namespace {

void hash_headers(Sha256Builder& h, std::span<const HeaderValues> headers) {
  for (const auto& header : headers) {
    h.field(std::to_string(header.values.size()));
    for (const auto v : header.values) h.field(v);
  }
}

/// Builds the canonical text while Boost.JSON parses (SAX). Numbers keep their text as received:
/// going through double would make distinct numbers equal (9007199254740993 and
/// 9007199254740992, or two 32-digit amounts) and the result not a fixed point.
class CanonicalWriter {
 public:
  constexpr static std::size_t max_object_size = std::size_t(-1);
  constexpr static std::size_t max_array_size = std::size_t(-1);
  constexpr static std::size_t max_key_size = std::size_t(-1);
  constexpr static std::size_t max_string_size = std::size_t(-1);

  std::string result;

  bool on_document_begin(boost::json::error_code&) { return true; }
  bool on_document_end(boost::json::error_code&) { return true; }
  bool on_array_begin(boost::json::error_code&) {
    frames_.push_back({false, {}, {}});
    return true;
  }
  bool on_array_end(std::size_t, boost::json::error_code&) {
    std::string out = "[";
    for (std::size_t i = 0; i < frames_.back().members.size(); ++i) {
      if (i) out += ',';
      out += frames_.back().members[i].second;
    }
    out += ']';
    frames_.pop_back();
    return value(std::move(out));
  }
  bool on_object_begin(boost::json::error_code&) {
    frames_.push_back({true, {}, {}});
    return true;
  }
  bool on_object_end(std::size_t, boost::json::error_code&) {
    auto& members = frames_.back().members;
    std::stable_sort(members.begin(), members.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out = "{";
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i) out += ',';
      out += boost::json::serialize(boost::json::string_view(members[i].first));
      out += ':';
      out += members[i].second;
    }
    out += '}';
    frames_.pop_back();
    return value(std::move(out));
  }
  bool on_string_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    text_.append(s.data(), s.size());
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    text_.append(s.data(), s.size());
    std::string out = boost::json::serialize(boost::json::string_view(text_));
    text_.clear();
    return value(std::move(out));
  }
  bool on_key_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    text_.append(s.data(), s.size());
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    text_.append(s.data(), s.size());
    frames_.back().key = std::move(text_);
    text_.clear();
    return true;
  }
  bool on_number_part(boost::json::string_view s, boost::json::error_code&) {
    text_.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t, boost::json::string_view s, boost::json::error_code&) {
    return number(s);
  }
  bool on_uint64(std::uint64_t, boost::json::string_view s, boost::json::error_code&) {
    return number(s);
  }
  bool on_double(double, boost::json::string_view s, boost::json::error_code&) { return number(s); }
  bool on_bool(bool b, boost::json::error_code&) { return value(b ? "true" : "false"); }
  bool on_null(boost::json::error_code&) { return value("null"); }
  bool on_comment_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::json::error_code&) { return true; }

 private:
  struct Frame {
    bool object;
    std::string key;
    std::vector<std::pair<std::string, std::string>> members;  ///< key ("" in arrays), text
  };

  bool number(boost::json::string_view s) {
    text_.append(s.data(), s.size());
    std::string out = std::move(text_);
    text_.clear();
    return value(std::move(out));
  }
  bool value(std::string text) {
    if (frames_.empty()) {
      result = std::move(text);
    } else {
      Frame& top = frames_.back();
      top.members.emplace_back(top.object ? std::move(top.key) : std::string(), std::move(text));
      top.key.clear();
    }
    return true;
  }

  std::vector<Frame> frames_;
  std::string text_;
};

}  // namespace

Sha256 compute_scope(std::string_view route_name, std::span<const HeaderValues> scope_headers) {
  Sha256Builder h;
  h.field("idemgate-scope-v1").field(route_name);
  hash_headers(h, scope_headers);
  return h.finish();
}

Sha256 record_id(const Sha256& scope, std::string_view key) {
  Sha256Builder h;
  h.field("idemgate-record-v1")
      .field(std::string_view(reinterpret_cast<const char*>(scope.data()), scope.size()))
      .field(key);
  return h.finish();
}

std::string upstream_key_rewrite(std::string_view secret, const Sha256& scope,
                                 std::string_view key) {
  Sha256Builder material;
  material.field(to_hex(scope)).field(key);
  const Sha256 digest = material.finish();
  return hmac_sha256_hex(
      secret, std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::optional<std::string> canonical_json(std::string_view body) {
  boost::json::basic_parser<CanonicalWriter> parser{boost::json::parse_options{}};
  boost::system::error_code ec;
  const std::size_t n = parser.write_some(false, body.data(), body.size(), ec);
  if (ec || !parser.done() || n != body.size()) return std::nullopt;
  return std::move(parser.handler().result);
}

Sha256 compute_fingerprint(std::string_view method, std::string_view target,
                           std::span<const HeaderValues> headers, std::string_view body,
                           BodyMode mode) {
  Sha256Builder h;
  h.field("idemgate-fingerprint-v1").field(method).field(target);
  hash_headers(h, headers);
  if (mode == BodyMode::json) {
    if (auto canonical = canonical_json(body)) {
      h.field("json").field(*canonical);
      return h.finish();
    }
  }
  h.field("bytes").field(body);
  return h.finish();
}

}  // namespace idemgate::core
