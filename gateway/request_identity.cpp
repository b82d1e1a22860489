#include "gateway/request_identity.hpp"

namespace idemgate {

std::vector<std::string_view> field_values(const boost::beast::http::fields& fields,
                                           std::string_view name) {
  std::vector<std::string_view> out;
  auto range = fields.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->value());
  return out;
}

std::vector<core::HeaderValues> header_values(const boost::beast::http::fields& fields,
                                              const std::vector<std::string>& names) {
  std::vector<core::HeaderValues> out;
  out.reserve(names.size());
  for (const auto& name : names) out.push_back({name, field_values(fields, name)});
  return out;
}

core::Sha256 request_scope(const config::Route& route, const boost::beast::http::fields& fields) {
  const auto scope_headers =
      header_values(fields, config::contract_of(route).idempotency.key_scope_headers);
  return core::compute_scope(route.name, scope_headers);
}

core::Sha256 request_fingerprint(
    const config::Idempotency& idem,
    const boost::beast::http::request<boost::beast::http::string_body>& req) {
  const auto headers = header_values(req, idem.fingerprint_headers);
  return core::compute_fingerprint(req.method_string(), req.target(), headers, req.body(),
                                   idem.fingerprint_body == config::FingerprintBody::json
                                       ? core::BodyMode::json
                                       : core::BodyMode::bytes);
}

core::KeyParse request_key(const config::Idempotency& idempotency,
                           const boost::beast::http::fields& fields, std::string_view body) {
  return core::read_key(
      idempotency.key, [&](std::string_view name) { return field_values(fields, name); }, body);
}

}  // namespace idemgate
