#define BOOST_TEST_MODULE idempotency_key
#include "gateway/core/idempotency_key.hpp"

#include <boost/test/unit_test.hpp>
#include <vector>

using idemgate::core::KeyParse;
using idemgate::core::parse_key_field;

namespace {

KeyParse parse(std::vector<std::string_view> values) {
  return parse_key_field("Idempotency-Key", values);
}

void expect_invalid(std::vector<std::string_view> values, std::string_view detail_part) {
  const KeyParse p = parse(std::move(values));
  BOOST_TEST(static_cast<int>(p.status) == static_cast<int>(KeyParse::Status::invalid));
  BOOST_TEST(p.detail.find(detail_part) != std::string::npos, p.detail);
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C13_no_field_is_absent) {
  BOOST_TEST(static_cast<int>(parse({}).status) == static_cast<int>(KeyParse::Status::absent));
}

BOOST_AUTO_TEST_CASE(spec_C13_accepts_bare_and_sf_string_forms) {
  BOOST_TEST(parse({"abc-123"}).key == "abc-123");
  BOOST_TEST(parse({"\"abc 123\""}).key == "abc 123");
  BOOST_TEST(parse({"\"a\\\"b\\\\c\""}).key == "a\"b\\c");
  BOOST_TEST(parse({"  \tabc \t"}).key == "abc");
}

BOOST_AUTO_TEST_CASE(spec_C28_quoted_and_bare_forms_are_the_same_key_and_case_matters) {
  BOOST_TEST(parse({"\"abc\""}).key == parse({"abc"}).key);
  BOOST_TEST(parse({"ABC"}).key != parse({"abc"}).key);
}

BOOST_AUTO_TEST_CASE(spec_C13_rejects_empty_values) {
  expect_invalid({""}, "must not be empty");
  expect_invalid({"   "}, "must not be empty");
  expect_invalid({"\"\""}, "must not be empty");
}

BOOST_AUTO_TEST_CASE(spec_C13_length_limit_is_255_after_unquoting) {
  const std::string k255(255, 'k');
  const std::string k256(256, 'k');
  BOOST_TEST(parse({k255}).key == k255);
  const std::string quoted255 = "\"" + k255 + "\"";
  BOOST_TEST(parse({quoted255}).key == k255);
  expect_invalid({k256}, "the limit is 255");
  const std::string big(10 * 1024, 'x');
  expect_invalid({big}, "10240 characters");
}

BOOST_AUTO_TEST_CASE(spec_C13_rejects_control_and_non_ascii_bytes) {
  expect_invalid({"ab\x01"
                  "c"},
                 "0x01");
  expect_invalid({"caf\xc3\xa9"}, "0xC3");
  expect_invalid({"\"ab\tc\""}, "0x09");
  expect_invalid({"ab c"}, "0x20");
  expect_invalid({"\"caf\xc3\xa9\""}, "0xC3");
}

BOOST_AUTO_TEST_CASE(spec_C13_rejects_two_fields_lists_and_parameters) {
  expect_invalid({"a", "b"}, "2 Idempotency-Key fields");
  expect_invalid({"\"a\", \"b\""}, "parameters and lists");
  expect_invalid({"\"a\";p=1"}, "parameters and lists");
  expect_invalid({"a,b"}, "not a list");
  expect_invalid({"a;p=1"}, "not a list");
}

BOOST_AUTO_TEST_CASE(spec_C13_rejects_bad_escapes_and_unterminated_strings) {
  expect_invalid({"\"a\\nb\""}, "invalid escape");
  expect_invalid({"\"abc"}, "not closed");
  expect_invalid({"\"abc\\\""}, "not closed");
  expect_invalid({"ab\"cd"}, "not a list");
}

BOOST_AUTO_TEST_CASE(spec_C13_split_quote_pair_in_two_fields_is_rejected) {
  // `"ab` + `cd"` must not be glued into one key.
  expect_invalid({"\"ab", "cd\""}, "2 Idempotency-Key fields");
}

BOOST_AUTO_TEST_CASE(spec_C37_composite_keys_are_length_prefixed_and_unambiguous) {
  using idemgate::core::join_key_parts;
  const std::vector<std::string> names = {"X-Saga-Id", "X-Saga-Step"};
  const std::vector<KeyParse> a = {KeyParse::valid("a|b"), KeyParse::valid("c")};
  const std::vector<KeyParse> b = {KeyParse::valid("a"), KeyParse::valid("b|c")};
  BOOST_TEST(join_key_parts(names, a).key != join_key_parts(names, b).key);
  const std::vector<KeyParse> partial = {KeyParse::valid("a"), KeyParse::absent()};
  const KeyParse p = join_key_parts(names, partial);
  BOOST_TEST(static_cast<int>(p.status) == static_cast<int>(KeyParse::Status::invalid));
  BOOST_TEST(p.detail.find("X-Saga-Step") != std::string::npos);
  const std::vector<KeyParse> none = {KeyParse::absent(), KeyParse::absent()};
  BOOST_TEST(static_cast<int>(join_key_parts(names, none).status) ==
             static_cast<int>(KeyParse::Status::absent));
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_keys_distinguish_strings_from_integers) {
  using idemgate::core::parse_json_pointer_key;
  BOOST_TEST(parse_json_pointer_key(R"({"event_id":"42"})", "/event_id").key == "s:42");
  BOOST_TEST(parse_json_pointer_key(R"({"event_id":42})", "/event_id").key == "i:42");
  BOOST_TEST(parse_json_pointer_key(R"({"a":{"b":"x"}})", "/a/b").key == "s:x");
  BOOST_TEST(static_cast<int>(parse_json_pointer_key(R"({"a":1})", "/event_id").status) ==
             static_cast<int>(KeyParse::Status::absent));
  BOOST_TEST(static_cast<int>(parse_json_pointer_key("not json", "/event_id").status) ==
             static_cast<int>(KeyParse::Status::invalid));
  BOOST_TEST(static_cast<int>(parse_json_pointer_key(R"({"event_id":1.5})", "/event_id").status) ==
             static_cast<int>(KeyParse::Status::invalid));
  BOOST_TEST(static_cast<int>(parse_json_pointer_key(R"({"event_id":""})", "/event_id").status) ==
             static_cast<int>(KeyParse::Status::invalid));
}
