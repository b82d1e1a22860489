// What every module uses (gateway/common): host:port, hex, the HTTP date, the exception text of
// detached tasks.
#define BOOST_TEST_MODULE common
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <stdexcept>
#include <string>

#include "gateway/common/hex.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/common/http_date.hpp"
#include "gateway/common/log_on_exception.hpp"

namespace common = idemgate::common;

BOOST_AUTO_TEST_CASE(host_port_reads_names_ipv4_and_bracketed_ipv6) {
  const auto name = common::parse_host_port("api.internal:80");
  BOOST_TEST_REQUIRE(name.value.has_value());
  BOOST_TEST(name.value->host == "api.internal");
  BOOST_TEST(name.value->port == 80);
  const auto v6 = common::parse_host_port("[::1]:9001");
  BOOST_TEST_REQUIRE(v6.value.has_value());
  BOOST_TEST(v6.value->host == "::1");
  BOOST_TEST(v6.value->port == 9001);
  const auto empty_host = common::parse_host_port(":7001");
  BOOST_TEST_REQUIRE(empty_host.value.has_value());
  BOOST_TEST(empty_host.value->host.empty());
  BOOST_TEST(common::parse_host_port("10.0.0.2:65535").value->port == 65535);
}

BOOST_AUTO_TEST_CASE(host_port_says_why_a_text_is_refused) {
  using E = common::HostPortError;
  const auto error_of = [](std::string_view text) {
    const auto parsed = common::parse_host_port(text);
    BOOST_TEST(!parsed.value.has_value(), text);
    return parsed.error;
  };
  BOOST_TEST((error_of("::1:9001") == E::ipv6_unbracketed));
  BOOST_TEST((error_of("[fe80::zz]:80") == E::bad_ipv6));
  BOOST_TEST((error_of("127.0.0.1:0") == E::bad_port));
  BOOST_TEST((error_of("127.0.0.1:65536") == E::bad_port));
  BOOST_TEST((error_of("127.0.0.1") == E::syntax));
  BOOST_TEST((error_of("user@host:80") == E::syntax));
  BOOST_TEST((error_of("host:80/path") == E::syntax));
  BOOST_TEST((error_of("[::1]") == E::syntax));
}

BOOST_AUTO_TEST_CASE(host_port_is_written_with_brackets_around_ipv6) {
  BOOST_TEST(common::format_host_port("::1", 9001) == "[::1]:9001");
  BOOST_TEST(common::format_host_port("127.0.0.1", 80) == "127.0.0.1:80");
  BOOST_TEST(common::format_host_port("api.internal", 443) == "api.internal:443");
}

BOOST_AUTO_TEST_CASE(authority_host_drops_the_port_and_keeps_ipv6_brackets) {
  BOOST_TEST(common::authority_host("example.com:80") == "example.com");
  BOOST_TEST(common::authority_host("Example.com") == "Example.com");
  BOOST_TEST(common::authority_host(" example.com:80 ") == "example.com");
  BOOST_TEST(common::authority_host("[::1]:8080") == "[::1]");
  BOOST_TEST(common::authority_host("[::1]") == "[::1]");
  BOOST_TEST(common::authority_host("").empty());
  // Not an authority: still compared by what precedes the port.
  BOOST_TEST(common::authority_host("a b:80") == "a b");
}

BOOST_AUTO_TEST_CASE(hex_is_lower_case_two_digits_a_byte) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa0, 0xff};
  BOOST_TEST(common::hex(bytes, sizeof bytes) == "000fa0ff");
  BOOST_TEST(common::hex(bytes, 0).empty());
}

BOOST_AUTO_TEST_CASE(spec_C16_date_is_imf_fixdate) {
  // 784111777 = Sun, 06 Nov 1994 08:49:37 GMT (the RFC 9110 example).
  const auto t = std::chrono::system_clock::from_time_t(784111777);
  BOOST_TEST(common::format_http_date(t) == "Sun, 06 Nov 1994 08:49:37 GMT");
}

BOOST_AUTO_TEST_CASE(exception_text_names_what_escaped_a_task) {
  BOOST_TEST(common::exception_text(nullptr).empty());
  BOOST_TEST(common::exception_text(std::make_exception_ptr(std::runtime_error("boom"))) == "boom");
  BOOST_TEST(common::exception_text(std::make_exception_ptr(42)) == "unknown exception");
}
