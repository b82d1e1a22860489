// Inputs the fuzz targets of fuzz/ found, each with the behaviour it now has. The same inputs
// are kept in fuzz/regressions/<target>/ and replayed through the targets.
#define BOOST_TEST_MODULE fuzz_regression
#include <boost/test/unit_test.hpp>
#include <string>

#include "gateway/config/config_loader.hpp"

namespace config = idemgate::config;

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
