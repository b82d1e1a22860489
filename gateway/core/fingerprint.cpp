#include "gateway/core/fingerprint.hpp"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace idemgate::core {
namespace {

void hash_headers(Sha256Builder& h, std::span<const HeaderValues> headers) {
  for (const auto& header : headers) {
    h.field(std::to_string(header.values.size()));
    for (const auto v : header.values) h.field(v);
  }
}

void write_canonical(const boost::json::value& v, std::string& out) {
  switch (v.kind()) {
    case boost::json::kind::object: {
      const auto& obj = v.get_object();
      std::vector<const boost::json::key_value_pair*> members;
      members.reserve(obj.size());
      for (const auto& kv : obj) members.push_back(&kv);
      std::sort(members.begin(), members.end(),
                [](const auto* a, const auto* b) { return a->key() < b->key(); });
      out += '{';
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i) out += ',';
        out += boost::json::serialize(boost::json::string_view(members[i]->key()));
        out += ':';
        write_canonical(members[i]->value(), out);
      }
      out += '}';
      return;
    }
    case boost::json::kind::array: {
      const auto& arr = v.get_array();
      out += '[';
      for (std::size_t i = 0; i < arr.size(); ++i) {
        if (i) out += ',';
        write_canonical(arr[i], out);
      }
      out += ']';
      return;
    }
    default:
      out += boost::json::serialize(v);
  }
}

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

std::optional<std::string> canonical_json(std::string_view body) {
  boost::system::error_code ec;
  const boost::json::value doc = boost::json::parse(body, ec);
  if (ec) return std::nullopt;
  std::string out;
  out.reserve(body.size());
  write_canonical(doc, out);
  return out;
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
