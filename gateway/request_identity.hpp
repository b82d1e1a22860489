#pragma once
// How a request's header fields enter its record identity (SPEC §4), shared by the idempotency
// handler and the `idemgate keys` command so that both derive the same record id.

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/config/config.hpp"
#include "gateway/core/fingerprint.hpp"
#include "gateway/core/hash.hpp"
#include "gateway/core/idempotency_key.hpp"

namespace idemgate {

/// Every value of the fields named `name` (case-insensitive), in arrival order. The views point
/// into `fields`.
std::vector<std::string_view> field_values(const boost::beast::http::fields& fields,
                                           std::string_view name);

/// field_values() for each of `names`, in the order of `names` (for compute_scope and
/// compute_fingerprint). The views point into `fields` and `names`.
std::vector<core::HeaderValues> header_values(const boost::beast::http::fields& fields,
                                              const std::vector<std::string>& names);

/// The key scope of a request on `route`: SHA-256 over the route name and the values of its
/// `idempotency.key_scope.headers` in `fields` (SPEC §4, C20).
core::Sha256 request_scope(const config::Route& route, const boost::beast::http::fields& fields);

/// The fingerprint of `req` under `idem` (SPEC §4, C27, C35): its method and target as received,
/// the values of `fingerprint.headers`, and its body as the session hands it over (after
/// transfer decoding), hashed as `fingerprint_body` says.
core::Sha256 request_fingerprint(
    const config::Idempotency& idem,
    const boost::beast::http::request<boost::beast::http::string_body>& req);

/// The request's idempotency key on a route with these settings (SPEC C13, C37, C55, C56):
/// core::read_key over `idempotency.key` with `fields` and `body`. The one reader of keys that
/// the handler, `idemgate keys` and the fuzz targets share.
core::KeyParse request_key(const config::Idempotency& idempotency,
                           const boost::beast::http::fields& fields, std::string_view body);

}  // namespace idemgate
