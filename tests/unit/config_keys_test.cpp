#define BOOST_TEST_MODULE config_keys
#include <boost/test/unit_test.hpp>

#include <string>

#include "gateway/config/config_loader.hpp"
#include "tests/support/config_text.hpp"

// The keys of SPEC §4c (C55-C58): their defaults, and every bad value refused with
// `FILE:LINE: key.path: problem`.

namespace cfg = idemgate::config;

namespace {

// Lines 1-11; a test appends keys under `idempotency:` (line 12 onwards).
const std::string kBase = idemgate::test::kMinimalConfig +
                          "    idempotency:\n"       // 10
                          "      mode: required\n";  // 11

// The shared loader helpers (tests/support/config_text.hpp) under the names used here.
constexpr auto& load = idemgate::test::load_config_text;
constexpr auto& error_of = idemgate::test::config_error_of;

const cfg::Idempotency& idem(const std::shared_ptr<const cfg::Config>& c) {
  return cfg::contract_of(c->routes.at(0)).idempotency;
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

BOOST_AUTO_TEST_CASE(spec_C57_cors_reads_origins_lists_and_max_age) {
  const auto c = load(kBase +
                      "    cors: { allow_origins: [\"https://App.Example.com\", "
                      "\"http://[::1]:8080\"], allow_headers: [Content-Type], "
                      "expose_headers: [Location], max_age: 10m, allow_credentials: true }\n");
  const auto& cors = cfg::contract_of(c->routes.at(0)).cors;
  BOOST_TEST_REQUIRE(cors.has_value());
  BOOST_TEST((cors->allow_origins ==
              std::vector<std::string>{"https://app.example.com", "http://[::1]:8080"}));
  BOOST_TEST((cors->allow_methods == std::vector<std::string>{"GET", "HEAD", "POST"}));
  BOOST_TEST(cors->allow_headers == std::vector<std::string>{"Content-Type"});
  BOOST_TEST(cors->expose_headers == std::vector<std::string>{"Location"});
  BOOST_TEST(cors->max_age->count() == 600'000);
  BOOST_TEST(cors->allow_credentials);
  BOOST_TEST(!cfg::contract_of(load(kBase)->routes.at(0)).cors.has_value());
  const auto any = load(kBase + "    cors: { allow_origins: [\"*\"], allow_headers: [\"*\"] }\n");
  BOOST_TEST(cfg::contract_of(any->routes.at(0)).cors->allow_origins ==
             std::vector<std::string>{"*"});
}

BOOST_AUTO_TEST_CASE(spec_C57_bad_cors_values_are_refused_naming_file_line_and_key) {
  const std::string at = "t.yaml:12: routes[0].cors";
  BOOST_TEST(error_of(kBase + "    cors: { allow_methods: [GET] }\n") ==
             at + ".allow_origins: required key is missing");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [] }\n") ==
             at + ".allow_origins: at least one origin (or \"*\") is required");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"https://a.example/\"] }\n") ==
             at + ".allow_origins[0]: an origin has no path, query or trailing \"/\": write "
                  "\"https://a.example\"");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"null\"] }\n") ==
             at + ".allow_origins[0]: the null origin cannot be allowed: sandboxed frames and "
                  "local files of any site send it");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [a.example] }\n") ==
             at + ".allow_origins[0]: expected an origin such as \"https://app.example.com\", "
                  "got \"a.example\"");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"https://a.example:x\"] }\n") ==
             at + ".allow_origins[0]: the port must be digits, got \"https://a.example:x\"");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"*\", \"https://a.example\"] }\n") ==
             at + ".allow_origins[0]: \"*\" stands alone: it already allows every origin");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"https://a.example\", "
                              "\"https://A.example\"] }\n") ==
             at + ".allow_origins[1]: duplicate origin \"https://a.example\"");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"*\"], allow_credentials: true }\n") ==
             at + ".allow_origins: \"*\" cannot be used with allow_credentials: true (the Fetch "
                  "standard forbids it; browsers reject the response): list the values");
  BOOST_TEST(error_of(kBase +
                      "    cors: { allow_origins: [\"https://a.example\"], allow_headers: [\"*\"], "
                      "allow_credentials: true }\n") ==
             at + ".allow_headers: \"*\" cannot be used with allow_credentials: true (the Fetch "
                  "standard forbids it; browsers reject the response): list the values");
  BOOST_TEST(
      error_of(kBase + "    cors: { allow_origins: [\"https://a.example\"], max_age: 1500ms }\n") ==
      at + ".max_age: must be whole seconds (Access-Control-Max-Age)");
  BOOST_TEST(
      error_of(kBase + "    cors: { allow_origins: [\"https://a.example\"], max_age: 25h }\n") ==
      at + ".max_age: must be between 0s and 24h, got 25h");
  BOOST_TEST(
      error_of(kBase +
               "    cors: { allow_origins: [\"https://a.example\"], allow_methods: [] }\n") ==
      at + ".allow_methods: must not be empty");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origins: [\"https://a.example\"], expose_headers: "
                              "[\"a b\"] }\n") ==
             at + ".expose_headers[0]: \"a b\" is not a valid header name");
  BOOST_TEST(error_of(kBase +
                      "    cors: { allow_origins: [\"https://a.example\"], allow_credentials: yes "
                      "}\n") ==
             at + ".allow_credentials: expected one of true | false, got \"yes\"");
  BOOST_TEST(error_of(kBase + "    cors: { allow_origin: [\"https://a.example\"] }\n") ==
             at + ".allow_origin: unknown key (expected one of: allow_origins, allow_methods, "
                  "allow_headers, expose_headers, max_age, allow_credentials)");
}

BOOST_AUTO_TEST_CASE(spec_C57_options_is_never_keyed) {
  BOOST_TEST(error_of(kBase + "      methods: [POST, OPTIONS]\n") ==
             "t.yaml:12: routes[0].idempotency.methods: OPTIONS is never keyed (SPEC C57): "
             "browsers send preflights without a key");
}

BOOST_AUTO_TEST_CASE(spec_C58_allow_eviction_is_a_boolean_defaulting_to_false) {
  BOOST_TEST(!load(kBase)->storage.redis.allow_eviction);
  const std::string text = kBase.substr(0, kBase.find("upstreams:")) +
                           "  redis: { address: 127.0.0.1, port: 6379, allow_eviction: true }\n" +
                           kBase.substr(kBase.find("upstreams:"));
  BOOST_TEST(load(text)->storage.redis.allow_eviction);
  const std::string bad = kBase.substr(0, kBase.find("upstreams:")) +
                          "  redis: { address: 127.0.0.1, allow_eviction: sometimes }\n" +
                          kBase.substr(kBase.find("upstreams:"));
  BOOST_TEST(error_of(bad) ==
             "t.yaml:4: storage.redis.allow_eviction: expected one of true | false, got "
             "\"sometimes\"");
}
