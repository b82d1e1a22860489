#define BOOST_TEST_MODULE fingerprint
#include "gateway/core/fingerprint.hpp"

#include <boost/test/unit_test.hpp>

using namespace idemgate::core;

namespace {

Sha256 fp(std::string_view method, std::string_view target, std::string_view content_type,
          std::string_view body, BodyMode mode = BodyMode::bytes) {
  std::vector<HeaderValues> headers = {{"Content-Type", {content_type}}};
  return compute_fingerprint(method, target, headers, body, mode);
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C27_fingerprint_depends_only_on_decoded_body_bytes) {
  // The HTTP layer hands the same decoded bytes for Content-Length and chunked requests, so
  // equal bytes must give equal fingerprints regardless of how they arrived.
  std::string chunked_assembled;
  for (std::string_view part : {"{\"amount\":", "\"10.00\"}"}) chunked_assembled += part;
  BOOST_TEST(fp("POST", "/payments", "application/json", "{\"amount\":\"10.00\"}") ==
             fp("POST", "/payments", "application/json", chunked_assembled));
}

BOOST_AUTO_TEST_CASE(spec_C17_every_fingerprint_input_changes_the_fingerprint) {
  const Sha256 base = fp("POST", "/payments?x=1", "application/json", "{}");
  BOOST_TEST(base != fp("PATCH", "/payments?x=1", "application/json", "{}"));
  BOOST_TEST(base != fp("POST", "/payments?x=2", "application/json", "{}"));
  BOOST_TEST(base != fp("POST", "/payments?x=1", "text/plain", "{}"));
  BOOST_TEST(base != fp("POST", "/payments?x=1", "application/json", "{ }"));
}

BOOST_AUTO_TEST_CASE(absent_and_empty_headers_hash_differently) {
  std::vector<HeaderValues> absent = {{"Content-Type", {}}};
  std::vector<HeaderValues> empty = {{"Content-Type", {""}}};
  BOOST_TEST(compute_fingerprint("POST", "/", absent, "", BodyMode::bytes) !=
             compute_fingerprint("POST", "/", empty, "", BodyMode::bytes));
}

BOOST_AUTO_TEST_CASE(field_boundaries_cannot_be_shifted) {
  BOOST_TEST(fp("POST", "/ab", "c", "") != fp("POST", "/a", "bc", ""));
}

BOOST_AUTO_TEST_CASE(spec_C35_json_mode_ignores_member_order_and_white_space) {
  const auto a =
      fp("POST", "/e", "application/json", R"({"b":1,"a":[1,2,{"y":2,"x":1}]})", BodyMode::json);
  const auto b = fp("POST", "/e", "application/json",
                    "{ \"a\" : [1, 2, {\"x\":1,\"y\":2}],\n \"b\" : 1 }", BodyMode::json);
  BOOST_TEST(a == b);
  const auto c =
      fp("POST", "/e", "application/json", R"({"b":2,"a":[1,2,{"y":2,"x":1}]})", BodyMode::json);
  BOOST_TEST(a != c);
  // Array order is significant.
  BOOST_TEST(fp("POST", "/e", "", "[1,2]", BodyMode::json) !=
             fp("POST", "/e", "", "[2,1]", BodyMode::json));
}

BOOST_AUTO_TEST_CASE(spec_C35_json_mode_falls_back_to_bytes_for_non_json) {
  BOOST_TEST(fp("POST", "/e", "", "not json", BodyMode::json) ==
             fp("POST", "/e", "", "not json", BodyMode::json));
  BOOST_TEST(fp("POST", "/e", "", "not json", BodyMode::json) !=
             fp("POST", "/e", "", "not  json", BodyMode::json));
}

BOOST_AUTO_TEST_CASE(spec_C35_bytes_mode_is_sensitive_to_white_space) {
  BOOST_TEST(fp("POST", "/e", "", R"({"a":1})") != fp("POST", "/e", "", R"({ "a": 1 })"));
}

BOOST_AUTO_TEST_CASE(spec_C20_scopes_differ_by_client_identity_and_route) {
  std::vector<HeaderValues> alice = {{"Authorization", {"Bearer alice"}}};
  std::vector<HeaderValues> bob = {{"Authorization", {"Bearer bob"}}};
  BOOST_TEST(compute_scope("payments", alice) != compute_scope("payments", bob));
  BOOST_TEST(compute_scope("payments", alice) != compute_scope("refunds", alice));
  BOOST_TEST(record_id(compute_scope("payments", alice), "k") !=
             record_id(compute_scope("payments", bob), "k"));
  BOOST_TEST(record_id(compute_scope("payments", alice), "k") ==
             record_id(compute_scope("payments", alice), "k"));
}

BOOST_AUTO_TEST_CASE(canonical_json_sorts_members_and_strips_space) {
  BOOST_TEST(*canonical_json(R"( { "b" : "x y", "a" : null } )") == R"({"a":null,"b":"x y"})");
  BOOST_TEST(!canonical_json("{").has_value());
}
