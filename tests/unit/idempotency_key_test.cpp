#define BOOST_TEST_MODULE idempotency_key
#include "gateway/core/idempotency_key.hpp"

#include <boost/test/unit_test.hpp>
#include <utility>
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
  expect_invalid({"a;b,c"}, "not a list");
}

// SPEC C13: a bare key is visible ASCII without `"`, so `;` belongs to the key; only a quoted
// string ends at its closing quote (parameters after it stay a 400, see above).
BOOST_AUTO_TEST_CASE(spec_C13_accepts_a_semicolon_in_a_bare_key) {
  for (const auto& [field, key] : {std::pair{"a;p=1", "a;p=1"}, std::pair{";", ";"},
                                   std::pair{"  order-7;retry  ", "order-7;retry"}}) {
    const KeyParse p = parse({field});
    BOOST_TEST(static_cast<int>(p.status) == static_cast<int>(KeyParse::Status::valid), field);
    BOOST_TEST(p.key == key);
  }
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

namespace {

using idemgate::core::parse_json_pointer_key;

bool is_absent(const KeyParse& p) {
  return p.status == KeyParse::Status::absent;
}

// The key at `pointer`, or a description of why there is none (for failure messages).
std::string json_key(std::string_view body, std::string_view pointer) {
  const KeyParse p = parse_json_pointer_key(body, pointer);
  switch (p.status) {
    case KeyParse::Status::valid:
      return p.key;
    case KeyParse::Status::absent:
      return "<absent>";
    case KeyParse::Status::invalid:
      break;
  }
  return "<invalid: " + p.detail + ">";
}

void expect_json_invalid(std::string_view body, std::string_view pointer,
                         std::string_view detail_part) {
  const KeyParse p = parse_json_pointer_key(body, pointer);
  BOOST_TEST(static_cast<int>(p.status) == static_cast<int>(KeyParse::Status::invalid),
             "body " << body << " pointer " << pointer << " gave " << json_key(body, pointer));
  BOOST_TEST(p.detail.find(detail_part) != std::string::npos, p.detail);
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_unescapes_tilde_and_slash_in_member_names) {
  BOOST_TEST(json_key(R"({"a/b":"slash","a~b":"tilde"})", "/a~1b") == "s:slash");
  BOOST_TEST(json_key(R"({"a/b":"slash","a~b":"tilde"})", "/a~0b") == "s:tilde");
  // "~01" is "~" then "1", never "/".
  BOOST_TEST(json_key(R"({"~1":"literal","/":"slash"})", "/~01") == "s:literal");
  BOOST_TEST(json_key(R"({"":"empty name"})", "/") == "s:empty name");
  expect_json_invalid(R"({"a":"x"})", "/a~2", "not an RFC 6901 JSON Pointer");
  expect_json_invalid(R"({"a":"x"})", "event_id", "not an RFC 6901 JSON Pointer");
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_selects_array_elements_by_index) {
  const std::string body = R"({"events":[{"id":"e0"},{"id":"e1"},[10,11,12]]})";
  BOOST_TEST(json_key(body, "/events/0/id") == "s:e0");
  BOOST_TEST(json_key(body, "/events/1/id") == "s:e1");
  BOOST_TEST(json_key(body, "/events/2/2") == "i:12");
  BOOST_TEST(json_key(body, "/events/3/id") == "<absent>");
  BOOST_TEST(json_key(body, "/events/-/id") == "<absent>");
  BOOST_TEST(json_key(body, "/events/01/id") == "<absent>");
  BOOST_TEST(json_key(body, "/events/id") == "<absent>");
  BOOST_TEST(json_key(R"(["a","b"])", "/1") == "s:b");
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_absent_when_the_path_does_not_exist) {
  BOOST_TEST(is_absent(parse_json_pointer_key(R"({"id":"x"})", "/event_id")));
  BOOST_TEST(is_absent(parse_json_pointer_key(R"({})", "/event_id")));
  BOOST_TEST(is_absent(parse_json_pointer_key(R"({"data":{}})", "/data/event_id")));
  // Through a scalar or into a value of another shape.
  BOOST_TEST(is_absent(parse_json_pointer_key(R"({"data":"text"})", "/data/event_id")));
  BOOST_TEST(is_absent(parse_json_pointer_key(R"([1,2])", "/event_id")));
  BOOST_TEST(is_absent(parse_json_pointer_key(R"("just a string")", "/event_id")));
  // The name matches only at the position the pointer names.
  BOOST_TEST(is_absent(parse_json_pointer_key(R"({"data":{"event_id":"x"}})", "/event_id")));
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_value_must_be_a_string_or_an_integer) {
  BOOST_TEST(json_key(R"({"event_id":-7})", "/event_id") == "i:-7");
  BOOST_TEST(json_key(R"({"event_id":18446744073709551615})", "/event_id") ==
             "i:18446744073709551615");
  expect_json_invalid(R"({"event_id":1.5})", "/event_id", "string or an integer");
  expect_json_invalid(R"({"event_id":1e3})", "/event_id", "string or an integer");
  expect_json_invalid(R"({"event_id":true})", "/event_id", "string or an integer");
  expect_json_invalid(R"({"event_id":null})", "/event_id", "string or an integer");
  expect_json_invalid(R"({"event_id":{"id":"x"}})", "/event_id", "string or an integer");
  expect_json_invalid(R"({"event_id":["x"]})", "/event_id", "string or an integer");
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_string_is_1_to_255_characters_taken_verbatim) {
  const std::string k255(255, 'k');
  BOOST_TEST(json_key("{\"id\":\"" + k255 + "\"}", "/id") == "s:" + k255);
  expect_json_invalid("{\"id\":\"" + k255 + "k\"}", "/id", "1 to 255 characters, got 256");
  expect_json_invalid(R"({"id":""})", "/id", "1 to 255 characters, got 0");
  // Characters, not bytes: 255 two-byte characters fit.
  std::string e255;
  for (int i = 0; i < 255; ++i) e255 += "\xc3\xa9";
  BOOST_TEST(json_key("{\"id\":\"" + e255 + "\"}", "/id") == "s:" + e255);
  // JSON escapes are decoded; case and spaces are kept (C28: compared exactly).
  BOOST_TEST(json_key(R"({"id":"A \"b\" \u0063"})", "/id") == "s:A \"b\" c");
  BOOST_TEST(json_key(R"({"id":"abc"})", "/id") != json_key(R"({"id":"ABC"})", "/id"));
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_string_and_integer_keys_never_collide) {
  BOOST_TEST(json_key(R"({"id":42})", "/id") != json_key(R"({"id":"42"})", "/id"));
  BOOST_TEST(json_key(R"({"id":42})", "/id") != json_key(R"({"id":"i:42"})", "/id"));
}

BOOST_AUTO_TEST_CASE(spec_C37_body_that_is_not_one_json_document_is_invalid) {
  expect_json_invalid("", "/event_id", "it is empty");
  expect_json_invalid("event_id=1", "/event_id", "must be JSON");
  expect_json_invalid(R"({"event_id":"x")", "/event_id", "must be JSON");
  expect_json_invalid(R"({"event_id":"x"} {"event_id":"y"})", "/event_id", "must be JSON");
  expect_json_invalid(R"({"event_id":"x",})", "/event_id", "must be JSON");
  expect_json_invalid("{\"event_id\":\"x\"} // note", "/event_id", "must be JSON");
  expect_json_invalid("{\"event_id\":\"caf\xc3\"}", "/event_id", "must be JSON");
  // Nesting: deep values beside the key are fine; beyond 512 levels the body is refused.
  const auto nested = [](std::size_t depth) {
    return R"({"event_id":"x","data":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  BOOST_TEST(json_key(nested(100), "/event_id") == "s:x");
  expect_json_invalid(nested(600), "/event_id", "must be JSON");
  // Trailing white space is part of a JSON text.
  BOOST_TEST(json_key("{\"event_id\":\"x\"}\r\n ", "/event_id") == "s:x");
}

BOOST_AUTO_TEST_CASE(spec_C37_repeated_member_name_on_the_pointer_path_is_invalid) {
  expect_json_invalid(R"({"event_id":"a","event_id":"b"})", "/event_id", "\"event_id\" twice");
  expect_json_invalid(R"({"event_id":"a","event_id":"a"})", "/event_id", "twice");
  // Equal after unescaping.
  expect_json_invalid(R"({"event_id":"a","event\u005fid":"b"})", "/event_id", "twice");
  // A repeated container on the path, even when only one copy holds the key.
  expect_json_invalid(R"({"data":{"id":"a"},"data":{"other":1}})", "/data/id", "\"data\" twice");
  expect_json_invalid(R"({"data":{"id":"a","id":"b"}})", "/data/id", "\"id\" twice");
  expect_json_invalid(R"({"list":[{"id":1,"id":2}]})", "/list/0/id", "\"id\" twice");
  // A repeated name after the key was found still makes the body ambiguous.
  expect_json_invalid(R"({"event_id":"a","x":1,"event_id":{}})", "/event_id", "twice");
}

BOOST_AUTO_TEST_CASE(spec_C37_repeated_member_name_off_the_pointer_path_is_accepted) {
  BOOST_TEST(json_key(R"({"note":1,"note":2,"event_id":"a"})", "/event_id") == "s:a");
  BOOST_TEST(json_key(R"({"event_id":"a","meta":{"event_id":"x","event_id":"y"}})", "/event_id") ==
             "s:a");
  BOOST_TEST(json_key(R"({"data":{"id":"a","x":0,"x":1},"other":{"id":1,"id":2}})", "/data/id") ==
             "s:a");
  // Elements of an array other than the indexed one are off the path.
  BOOST_TEST(json_key(R"({"list":[{"id":1,"id":2},{"id":3}]})", "/list/1/id") == "i:3");
  // Inside the key's own sibling values.
  BOOST_TEST(json_key(R"({"event_id":7,"payload":{"a":[{"b":1,"b":2}]}})", "/event_id") == "i:7");
}

BOOST_AUTO_TEST_CASE(spec_C37_composite_parts_each_follow_the_header_rules) {
  using idemgate::core::join_key_parts;
  const std::vector<std::string> names = {"ce-source", "ce-id"};
  const std::vector<std::string_view> source = {"https://example.com/orders"};
  const std::vector<std::string_view> empty = {""};
  const std::vector<std::string_view> two = {"a", "b"};
  const std::vector<std::string_view> id = {"\"42\""};
  const std::string k256(256, 'k');
  const std::vector<std::string_view> too_long = {k256};

  const std::vector<KeyParse> ok = {parse_key_field(names[0], source),
                                    parse_key_field(names[1], id)};
  BOOST_TEST(join_key_parts(names, ok).key == "26:https://example.com/orders2:42");

  for (const auto& bad : {empty, two, too_long}) {
    const std::vector<KeyParse> parts = {parse_key_field(names[0], source),
                                         parse_key_field(names[1], bad)};
    const KeyParse p = join_key_parts(names, parts);
    BOOST_TEST(static_cast<int>(p.status) == static_cast<int>(KeyParse::Status::invalid));
    BOOST_TEST(p.detail.find("ce-id") != std::string::npos, p.detail);
  }
}

BOOST_AUTO_TEST_CASE(spec_C37_composite_keys_never_collide_for_any_split_of_the_same_bytes) {
  using idemgate::core::join_key_parts;
  const std::vector<std::string> names = {"X-Saga-Id", "X-Saga-Step"};
  // Every way to cut "ab:1:c" into two non-empty parts gives a different joined key, and none
  // equals a joined key whose parts contain the separators themselves.
  const std::string whole = "ab:1:c";
  std::vector<std::string> keys;
  for (std::size_t cut = 1; cut < whole.size(); ++cut) {
    const std::vector<KeyParse> parts = {KeyParse::valid(whole.substr(0, cut)),
                                         KeyParse::valid(whole.substr(cut))};
    keys.push_back(join_key_parts(names, parts).key);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = i + 1; j < keys.size(); ++j) BOOST_TEST(keys[i] != keys[j]);
  }
  const std::vector<KeyParse> a = {KeyParse::valid("1:a"), KeyParse::valid("b")};
  const std::vector<KeyParse> b = {KeyParse::valid("1"), KeyParse::valid("a1:b")};
  BOOST_TEST(join_key_parts(names, a).key != join_key_parts(names, b).key);
}
