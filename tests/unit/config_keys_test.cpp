#define BOOST_TEST_MODULE config_keys
#include <boost/test/unit_test.hpp>

#include <string>

#include "gateway/config/config_loader.hpp"

// The keys of SPEC §4c (C55-C58): their defaults, and every bad value refused with
// `FILE:LINE: key.path: problem`.

namespace cfg = idemgate::config;

namespace {

// Lines 1-11; a test appends keys under `idempotency:` (line 12 onwards).
const std::string kBase =
    "listen: { address: 127.0.0.1, port: 0 }\n"                         // 1
    "storage:\n"                                                        // 2
    "  postgres: { dsn: \"postgresql://idem@127.0.0.1:5432/idem\" }\n"  // 3
    "upstreams:\n"                                                      // 4
    "  app: { servers: [\"127.0.0.1:9001\"] }\n"                        // 5
    "routes:\n"                                                         // 6
    "  - name: r\n"                                                     // 7
    "    match: { path_prefix: / }\n"                                   // 8
    "    upstream: app\n"                                               // 9
    "    idempotency:\n"                                                // 10
    "      mode: required\n";                                           // 11

std::shared_ptr<const cfg::Config> load(const std::string& text) {
  return cfg::load_config_from_string(text, "t.yaml");
}

std::string error_of(const std::string& text) {
  try {
    load(text);
  } catch (const cfg::ConfigError& e) {
    return e.what();
  }
  return "loaded";
}

const cfg::Idempotency& idem(const std::shared_ptr<const cfg::Config>& c) {
  return c->routes.at(0).idempotency;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C55_key_headers_default_to_idempotency_key) {
  const auto c = load(kBase);
  BOOST_TEST(idem(c).key_headers == std::vector<std::string>{"Idempotency-Key"});
  BOOST_TEST(idem(c).key.fields == std::vector<std::string>{"Idempotency-Key"});
  BOOST_TEST((idem(c).key.format.kind() == idemgate::core::KeyFormat::Kind::any));
  BOOST_TEST(idem(c).upstream_key_applies);
}

BOOST_AUTO_TEST_CASE(spec_C55_key_headers_list_the_aliases_in_order) {
  const auto c = load(kBase + "      key_headers: [Idempotency-Key, X-Idempotency-Key]\n");
  BOOST_TEST(
      (idem(c).key.fields == std::vector<std::string>{"Idempotency-Key", "X-Idempotency-Key"}));
  BOOST_TEST(idem(c).key_source.header == "Idempotency-Key");
  BOOST_TEST(idem(c).upstream_key_applies);
}

BOOST_AUTO_TEST_CASE(spec_C55_bad_key_headers_are_refused_naming_file_line_and_key) {
  BOOST_TEST(error_of(kBase + "      key_headers: []\n") ==
             "t.yaml:12: routes[0].idempotency.key_headers: must not be empty");
  BOOST_TEST(error_of(kBase + "      key_headers: [Idempotency-Key, idempotency-key]\n") ==
             "t.yaml:12: routes[0].idempotency.key_headers[1]: duplicate header name "
             "\"idempotency-key\"");
  BOOST_TEST(error_of(kBase + "      key_headers: [\"bad name\"]\n") ==
             "t.yaml:12: routes[0].idempotency.key_headers[0]: \"bad name\" is not a valid "
             "header name");
  BOOST_TEST(error_of(kBase + "      key_headers: X-Key\n") ==
             "t.yaml:12: routes[0].idempotency.key_headers: expected a list, got \"X-Key\"");
  BOOST_TEST(error_of(kBase + "      key_headers: [X-Request-Id]\n") ==
             "t.yaml:12: routes[0].idempotency.key_headers: the key cannot come from "
             "X-Request-Id, where the gateway generates request ids; set request_id.generate: "
             "false or take the key from another field");
}

BOOST_AUTO_TEST_CASE(spec_C55_key_headers_and_key_source_together_are_refused) {
  BOOST_TEST(error_of(kBase + "      key_source: { header: ce-id }\n"
                              "      key_headers: [Idempotency-Key]\n") ==
             "t.yaml:13: routes[0].idempotency.key_headers: set either key_headers or "
             "key_source, not both: key_headers lists the fields that carry the key (aliases), "
             "key_source takes it from elsewhere (key_source.header is key_headers with one "
             "field)");
}

BOOST_AUTO_TEST_CASE(spec_C56_key_format_is_any_uuid_or_a_pattern) {
  using Kind = idemgate::core::KeyFormat::Kind;
  BOOST_TEST((idem(load(kBase + "      key_format: uuid\n")).key.format.kind() == Kind::uuid));
  BOOST_TEST((idem(load(kBase + "      key_format: any\n")).key.format.kind() == Kind::any));
  const auto c = load(kBase + "      key_format: { pattern: \"ord_[0-9]+\" }\n");
  BOOST_TEST((idem(c).key.format.kind() == Kind::pattern));
  BOOST_TEST(idem(c).key.format.pattern_text() == "ord_[0-9]+");
  const auto json =
      load(kBase + "      key_source: { json_pointer: /id }\n      key_format: uuid\n");
  BOOST_TEST((idem(json).key.format.kind() == Kind::uuid));
}

BOOST_AUTO_TEST_CASE(spec_C56_bad_key_formats_are_refused_naming_file_line_and_key) {
  BOOST_TEST(error_of(kBase + "      key_format: ulid\n") ==
             "t.yaml:12: routes[0].idempotency.key_format: expected any, uuid or { pattern: "
             "REGEX }, got \"ulid\"");
  BOOST_TEST(error_of(kBase + "      key_format: [uuid]\n") ==
             "t.yaml:12: routes[0].idempotency.key_format: expected any, uuid or { pattern: "
             "REGEX }, got a list");
  BOOST_TEST(error_of(kBase + "      key_format: { regex: x }\n") ==
             "t.yaml:12: routes[0].idempotency.key_format.regex: unknown key (expected one of: "
             "pattern)");
  BOOST_TEST(error_of(kBase + "      key_format: { pattern: \"\" }\n") ==
             "t.yaml:12: routes[0].idempotency.key_format.pattern: must not be empty");
  const std::string bad = error_of(kBase + "      key_format: { pattern: \"([a-z\" }\n");
  BOOST_TEST(bad.rfind("t.yaml:12: routes[0].idempotency.key_format.pattern: not a valid regular "
                       "expression: ",
                       0) == 0u,
             bad);
  BOOST_TEST(error_of(kBase + "      key_source: { headers: [X-Saga-Id, X-Saga-Step] }\n"
                              "      key_format: uuid\n") ==
             "t.yaml:13: routes[0].idempotency.key_format: a key joined from several headers "
             "(key_source.headers) has no single format; use any, or key_headers for a key in "
             "one field");
}
