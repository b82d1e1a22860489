#include "gateway/cors.hpp"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <string>
#include <vector>

#include "gateway/http/headers.hpp"
#include "gateway/idempotency_handler.hpp"

namespace idemgate {
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

namespace {

bool any_origin(const config::Cors& cors) {
  return cors.allow_origins.size() == 1 && cors.allow_origins.front() == "*";
}

bool allowed(const config::Cors& cors, std::string_view origin) {
  if (origin.empty()) return false;
  if (any_origin(cors)) return true;
  return std::any_of(cors.allow_origins.begin(), cors.allow_origins.end(),
                     [&](const std::string& o) { return beast::iequals(o, origin); });
}

// `a, b, c` of `first` then `more`, each name once (case-insensitive).
std::string joined(const std::vector<std::string>& first, const std::vector<std::string>& more) {
  std::vector<std::string> names;
  for (const auto* list : {&first, &more}) {
    for (const auto& n : *list) {
      if (std::none_of(names.begin(), names.end(),
                       [&](const std::string& s) { return beast::iequals(s, n); })) {
        names.push_back(n);
      }
    }
  }
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void remove_access_control(bhttp::response_header<>& response) {
  for (auto it = response.begin(); it != response.end();) {
    const std::string_view name = it->name_string();
    if (name.size() >= 15 && beast::iequals(name.substr(0, 15), "Access-Control-")) {
      it = response.erase(it);
    } else {
      ++it;
    }
  }
}

void set_origin_fields(const config::Cors& cors, std::string_view origin,
                       bhttp::response_header<>& response) {
  const bool star = any_origin(cors) && !cors.allow_credentials;
  response.set(bhttp::field::access_control_allow_origin, star ? std::string_view("*") : origin);
  if (cors.allow_credentials) response.set(bhttp::field::access_control_allow_credentials, "true");
}

void vary_on_origin(const config::Cors& cors, bhttp::response_header<>& response) {
  if (any_origin(cors) && !cors.allow_credentials) return;
  if (!http::has_token(response, "Vary", "Origin") && !http::has_token(response, "Vary", "*")) {
    http::append_to_list(response, "Vary", "Origin");
  }
}

}  // namespace

bool is_preflight(const bhttp::request_header<>& request) {
  return request.method() == bhttp::verb::options && request.count(bhttp::field::origin) > 0 &&
         request.count(bhttp::field::access_control_request_method) > 0;
}

bhttp::response<bhttp::string_body> preflight_response(const config::Route& route,
                                                       const bhttp::request_header<>& request) {
  bhttp::response<bhttp::string_body> res{bhttp::status::no_content, 11};
  const config::RouteContract& contract = config::contract_of(route);
  const config::Cors& cors = *contract.cors;
  vary_on_origin(cors, res);
  const std::string_view origin = request[bhttp::field::origin];
  if (!allowed(cors, origin)) return res;
  set_origin_fields(cors, origin, res);
  const config::Idempotency& idem = contract.idempotency;
  const std::vector<std::string> none;
  const bool keyed = idem.mode != config::IdempotencyMode::off;
  res.set(bhttp::field::access_control_allow_methods,
          joined(cors.allow_methods, keyed ? idem.methods : none));
  // The key fields are what a browser must be allowed to send (C57).
  const std::vector<std::string>& key_fields =
      keyed && idem.key.kind != core::KeySpec::Kind::json_pointer ? idem.key.fields : none;
  const std::string headers = joined(cors.allow_headers, key_fields);
  if (!headers.empty()) res.set(bhttp::field::access_control_allow_headers, headers);
  if (cors.max_age) {
    res.set(bhttp::field::access_control_max_age, std::to_string(cors.max_age->count() / 1000));
  }
  return res;
}

void add_cors_fields(const config::Route& route, std::string_view origin,
                     bhttp::response_header<>& response) {
  const std::optional<config::Cors>& route_cors = config::contract_of(route).cors;
  if (!route_cors) return;
  const config::Cors& cors = *route_cors;
  remove_access_control(response);
  vary_on_origin(cors, response);
  if (!allowed(cors, origin)) return;
  set_origin_fields(cors, origin, response);
  static const std::vector<std::string> kContractFields = {kReplayedField, kBodyOmittedField,
                                                           kStatusField, "Retry-After"};
  response.set(bhttp::field::access_control_expose_headers,
               joined(cors.expose_headers, kContractFields));
}

}  // namespace idemgate
