// Inputs the fuzz targets of fuzz/ found, each with the behaviour it now has. The same inputs
// are kept in fuzz/regressions/<target>/ and replayed through the targets.
#define BOOST_TEST_MODULE fuzz_regression
#include <boost/test/unit_test.hpp>
#include <string>

#include "gateway/config/config_loader.hpp"
#include "gateway/core/fingerprint.hpp"

namespace config = idemgate::config;
namespace core = idemgate::core;

namespace {

/// Loads `text`, which must be refused with ConfigError at line 1.
void expect_refused_at_line_1(const std::string& text) {
  try {
    config::load_config_from_string(text, "fuzz.yaml");
    BOOST_ERROR("loaded: " << text);
  } catch (const config::ConfigError& e) {
    BOOST_TEST(e.line() == 1, e.what());
  }
}

}  // namespace

// yaml-cpp 0.7's LoadAll never returned on these (endless empty documents, memory growing
// without bound): a JSON-style config with a trailing comma hung `idemgate --config`.
BOOST_AUTO_TEST_CASE(config_refuses_a_comma_where_a_document_should_start) {
  expect_refused_at_line_1(",");
  expect_refused_at_line_1("!$s,");
  expect_refused_at_line_1(
      "{listen: {port: 0}, storage: {postgres: {dsn: x}}, upstreams: {a: {servers: [\"h:1\"]}}, "
      "routes: [{name: r, match: {path_prefix: /}, upstream: a}]},");
}

BOOST_AUTO_TEST_CASE(config_still_refuses_a_second_document) {
  try {
    config::load_config_from_string("listen: {port: 0}\n---\nlisten: {port: 1}\n", "two.yaml");
    BOOST_ERROR("loaded two documents");
  } catch (const config::ConfigError& e) {
    BOOST_TEST(e.line() == 3, e.what());
    BOOST_TEST(e.problem() == "expected one YAML document, found more");
  }
}

// The framing fuzzer's body `77777777500000000000000000001459`: through double it became
// 7.77777775E31, then 7.777777749999999E31, and neighbouring integers shared one fingerprint.
BOOST_AUTO_TEST_CASE(spec_C35_canonical_json_keeps_numbers_as_received) {
  const auto big = core::canonical_json("77777777500000000000000000001459");
  BOOST_TEST(big.value() == "77777777500000000000000000001459");
  BOOST_TEST(core::canonical_json(*big).value() == *big);
  BOOST_TEST(core::canonical_json(R"({"id":9007199254740993})").value() !=
             core::canonical_json(R"({"id":9007199254740992})").value());
  BOOST_TEST(core::canonical_json(R"({ "b" : 0.1, "a" : [1e2, -0] })").value() ==
             R"({"a":[1e2,-0],"b":0.1})");
  const core::HeaderValues none[] = {{"Content-Type", {}}};
  BOOST_TEST(core::compute_fingerprint("POST", "/e", none, R"({"id":9007199254740993})",
                                       core::BodyMode::json) !=
             core::compute_fingerprint("POST", "/e", none, R"({"id":9007199254740992})",
                                       core::BodyMode::json));
}

BOOST_AUTO_TEST_CASE(canonical_json_still_refuses_what_is_not_one_json_document) {
  BOOST_TEST(!core::canonical_json(""));
  BOOST_TEST(!core::canonical_json("{} {}"));
  BOOST_TEST(!core::canonical_json("[1,]"));
  BOOST_TEST(!core::canonical_json("{\"a\":1} x"));
  BOOST_TEST(core::canonical_json(" {} ").value() == "{}");
}
