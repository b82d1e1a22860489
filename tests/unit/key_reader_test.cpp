#define BOOST_TEST_MODULE key_reader
#include <boost/test/unit_test.hpp>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/core/idempotency_key.hpp"
#include "gateway/core/key_format.hpp"

namespace core = idemgate::core;
using Status = core::KeyParse::Status;

namespace {

// A request's fields, names compared case-insensitively as HTTP does.
struct Fields {
  std::vector<std::pair<std::string, std::string>> list;

  core::FieldLookup lookup() const {
    return [this](std::string_view name) {
      std::vector<std::string_view> out;
      for (const auto& [n, v] : list) {
        if (n.size() == name.size() &&
            std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
              return std::tolower(static_cast<unsigned char>(a)) ==
                     std::tolower(static_cast<unsigned char>(b));
            })) {
          out.push_back(v);
        }
      }
      return out;
    };
  }
};

core::KeySpec aliases() {
  core::KeySpec spec;
  spec.fields = {"Idempotency-Key", "X-Idempotency-Key"};
  return spec;
}

core::KeyParse read(const core::KeySpec& spec, const Fields& fields, std::string_view body = {}) {
  return core::read_key(spec, fields.lookup(), body);
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C55_the_first_key_field_present_names_the_key) {
  const auto a = read(aliases(), {{{"X-Idempotency-Key", "legacy-1"}}});
  BOOST_TEST((a.status == Status::valid));
  BOOST_TEST(a.key == "legacy-1");
  const auto b = read(aliases(), {{{"idempotency-key", "k-2"}}});
  BOOST_TEST(b.key == "k-2");
  BOOST_TEST((read(aliases(), {{{"Other", "x"}}}).status == Status::absent));
}

BOOST_AUTO_TEST_CASE(spec_C55_two_key_fields_with_different_values_are_refused_naming_both) {
  const auto r = read(aliases(), {{{"Idempotency-Key", "a"}, {"X-Idempotency-Key", "b"}}});
  BOOST_TEST((r.status == Status::invalid));
  BOOST_TEST(r.detail.find("Idempotency-Key") != std::string::npos);
  BOOST_TEST(r.detail.find("X-Idempotency-Key") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(spec_C55_equal_values_in_two_key_fields_are_one_key_after_decoding) {
  const auto r = read(aliases(), {{{"Idempotency-Key", "\"abc\""}, {"X-Idempotency-Key", "abc"}}});
  BOOST_TEST((r.status == Status::valid));
  BOOST_TEST(r.key == "abc");
}

BOOST_AUTO_TEST_CASE(spec_C55_an_invalid_alias_is_refused_even_when_another_is_valid) {
  const auto r = read(aliases(), {{{"Idempotency-Key", "ok"}, {"X-Idempotency-Key", ""}}});
  BOOST_TEST((r.status == Status::invalid));
}

BOOST_AUTO_TEST_CASE(spec_C56_uuid_format_accepts_8_4_4_4_12_hex_in_either_case) {
  core::KeySpec spec;
  spec.format = core::KeyFormat::uuid();
  BOOST_TEST((read(spec, {{{"Idempotency-Key", "0f8fad5b-d9cb-469f-a165-70867728950e"}}}).status ==
              Status::valid));
  BOOST_TEST((read(spec, {{{"Idempotency-Key", "0F8FAD5B-D9CB-469F-A165-70867728950E"}}}).status ==
              Status::valid));
  for (const char* bad : {"0f8fad5b-d9cb-469f-a165-70867728950", "0f8fad5bd9cb469fa16570867728950e",
                          "0f8fad5b-d9cb-469f-a165-70867728950g", "order-1"}) {
    const auto r = read(spec, {{{"Idempotency-Key", bad}}});
    BOOST_TEST((r.status == Status::invalid), bad);
    BOOST_TEST(r.detail.find("UUID") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(spec_C56_pattern_must_match_the_whole_decoded_key) {
  core::KeySpec spec;
  spec.format = core::KeyFormat::pattern("ord_[a-z0-9]{4,}");
  BOOST_TEST((read(spec, {{{"Idempotency-Key", "\"ord_abcd\""}}}).status == Status::valid));
  const auto r = read(spec, {{{"Idempotency-Key", "xord_abcd"}}});
  BOOST_TEST((r.status == Status::invalid));
  BOOST_TEST(r.detail == "the key must match the pattern ord_[a-z0-9]{4,} (the whole key)");
}

BOOST_AUTO_TEST_CASE(spec_C56_a_catastrophic_pattern_refuses_the_key_instead_of_spinning) {
  core::KeySpec spec;
  spec.format = core::KeyFormat::pattern("(a+)+b");
  const std::string key(255, 'a');
  const auto r = read(spec, {{{"Idempotency-Key", key}}});
  BOOST_TEST((r.status == Status::invalid));
}

BOOST_AUTO_TEST_CASE(spec_C56_json_keys_are_checked_without_their_type_prefix) {
  core::KeySpec spec;
  spec.kind = core::KeySpec::Kind::json_pointer;
  spec.fields.clear();
  spec.json_pointer = "/id";
  spec.format = core::KeyFormat::pattern("[0-9]+");
  BOOST_TEST((read(spec, {}, R"({"id":"123"})").status == Status::valid));
  BOOST_TEST((read(spec, {}, R"({"id":123})").status == Status::valid));
  BOOST_TEST((read(spec, {}, R"({"id":"x1"})").status == Status::invalid));
}

BOOST_AUTO_TEST_CASE(spec_C56_invalid_patterns_are_refused_with_a_sentence) {
  BOOST_CHECK_THROW(core::KeyFormat::pattern("([a-z"), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(spec_C37_composite_keys_keep_their_length_prefixed_join) {
  core::KeySpec spec;
  spec.kind = core::KeySpec::Kind::headers;
  spec.fields = {"X-Saga-Id", "X-Saga-Step"};
  const auto r = read(spec, {{{"X-Saga-Id", "s1"}, {"X-Saga-Step", "charge"}}});
  BOOST_TEST(r.key == "2:s16:charge");
}
