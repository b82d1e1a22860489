// Request parsing of the example payment service: no network, no database.
#define BOOST_TEST_MODULE payment_request
#include "examples/payment-service/payment_request.hpp"

#include <boost/test/unit_test.hpp>

namespace payment = idemgate::examples::payment;

namespace {

std::string body_with_amount(const std::string& amount_json) {
  return R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":"e","amount":)" +
         amount_json + "}";
}

}  // namespace

BOOST_AUTO_TEST_CASE(accepts_decimals_with_up_to_four_fraction_digits) {
  for (const char* ok : {"1", "0.0001", "10.1234", "10.5", "999999999999999.9999", "0.5"})
    BOOST_TEST(payment::is_valid_amount(ok), ok);
}

BOOST_AUTO_TEST_CASE(rejects_amounts_numeric_19_4_cannot_hold_exactly_or_that_are_not_positive) {
  for (const char* bad : {"",
                          "0",
                          "0.0",
                          "0.0000",
                          "-1",
                          "+1",
                          "1e3",
                          "1E3",
                          "10.12345",
                          "010",
                          "00.5",
                          ".5",
                          "5.",
                          " 1",
                          "1 ",
                          "1,5",
                          "1234567890123456",
                          "NaN",
                          "Infinity",
                          "0x10"})
    BOOST_TEST(!payment::is_valid_amount(bad), "'" << bad << "'");
}

BOOST_AUTO_TEST_CASE(keeps_the_literal_text_of_a_json_number_amount) {
  // 999999999999999.9999 has no exact double; the parser must not go through one.
  auto parsed = payment::parse_payment_request(body_with_amount("999999999999999.9999"));
  BOOST_TEST_REQUIRE(std::holds_alternative<payment::PaymentRequest>(parsed));
  BOOST_TEST(std::get<payment::PaymentRequest>(parsed).amount == "999999999999999.9999");
}

BOOST_AUTO_TEST_CASE(accepts_a_json_string_amount_and_ignores_unknown_members) {
  auto parsed = payment::parse_payment_request(
      R"({"note":{"nested":[1,{"amount":"x"}]},"order_id":"o","customer_id":"c",)"
      R"("provider":"p","external_payment_id":"e","amount":"10.1234"})");
  BOOST_TEST_REQUIRE(std::holds_alternative<payment::PaymentRequest>(parsed));
  const auto& req = std::get<payment::PaymentRequest>(parsed);
  BOOST_TEST(req.amount == "10.1234");
  BOOST_TEST(req.order_id == "o");
  BOOST_TEST(req.external_payment_id == "e");
}

BOOST_AUTO_TEST_CASE(names_the_field_in_every_refusal) {
  const std::string max_id(payment::kMaxIdLength, 'x');
  const std::string utf8_max_id = [] {
    std::string s;
    for (std::size_t i = 0; i < payment::kMaxIdLength; ++i) s += "\xC3\xA9";  // é
    return s;
  }();
  struct Case {
    std::string body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {body_with_amount("10.12345"), "amount"},
      {body_with_amount("\"abc\""), "amount"},
      {body_with_amount("null"), "amount"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":")" + max_id +
           R"(x","amount":"1"})",
       "external_payment_id"},
      {R"({"order_id":1,"customer_id":"c","provider":"p","external_payment_id":"e","amount":"1"})",
       "order_id"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","provider":"q","external_payment_id":"e","amount":"1"})",
       "provider"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":"e"})", "amount"},
      {"{", ""},
      {"{} {}", ""},
      {"42", ""},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.body) {
      auto parsed = payment::parse_payment_request(c.body);
      BOOST_TEST_REQUIRE(std::holds_alternative<payment::FieldError>(parsed));
      const auto& error = std::get<payment::FieldError>(parsed);
      BOOST_TEST(error.field == c.field);
      BOOST_TEST(error.detail.find(c.field) != std::string::npos);
    }
  }

  // Lengths count characters, not bytes.
  for (const std::string& id : {max_id, utf8_max_id}) {
    auto parsed = payment::parse_payment_request(
        R"({"order_id":")" + id +
        R"(","customer_id":"c","provider":"p","external_payment_id":"e","amount":"1"})");
    BOOST_TEST(std::holds_alternative<payment::PaymentRequest>(parsed));
  }
}

BOOST_AUTO_TEST_CASE(event_requests_need_an_event_id_and_default_the_rest) {
  auto parsed = payment::parse_event_request(R"({"event_id":"e-1"})");
  BOOST_TEST_REQUIRE(std::holds_alternative<payment::EventRequest>(parsed));
  const auto& event = std::get<payment::EventRequest>(parsed);
  BOOST_TEST(event.event_id == "e-1");
  BOOST_TEST(event.topic == "http");
  BOOST_TEST(event.consumer_name == "payment-service");

  auto missing = payment::parse_event_request(R"({"topic":"t"})");
  BOOST_TEST_REQUIRE(std::holds_alternative<payment::FieldError>(missing));
  BOOST_TEST(std::get<payment::FieldError>(missing).field == "event_id");
}

BOOST_AUTO_TEST_CASE(ids_in_paths_are_positive_decimal_bigints) {
  BOOST_TEST(payment::parse_id("1").value_or(0) == 1);
  BOOST_TEST(payment::parse_id("9223372036854775807").value_or(0) == 9223372036854775807LL);
  for (const char* bad : {"", "0", "-1", "01", "1a", "9223372036854775808", "+1", " 1"})
    BOOST_TEST(!payment::parse_id(bad).has_value(), bad);
}
