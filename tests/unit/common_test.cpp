// What every module uses (gateway/common): host:port, hex, the HTTP date, the exception text of
// detached tasks, the random bytes of tokens and request ids.
#define BOOST_TEST_MODULE common
#include <sys/wait.h>
#include <unistd.h>
#include <boost/test/unit_test.hpp>

#include <array>
#include <chrono>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gateway/common/hex.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/common/http_date.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/random.hpp"

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

using Token = std::array<unsigned char, 16>;

Token draw() {
  Token t{};
  common::random_bytes(t.data(), t.size());
  return t;
}

BOOST_AUTO_TEST_CASE(random_bytes_never_hand_out_the_same_bytes_twice) {
  // 10 000 tokens cross many 4 KiB refills; a buffer position handed out twice repeats a token.
  std::set<Token> seen;
  for (int i = 0; i < 10'000; ++i) BOOST_TEST_REQUIRE(seen.insert(draw()).second);
  // Uneven sizes straddle the block boundary; a draw larger than a block bypasses the buffer.
  std::vector<unsigned char> odd(4093), big(10'000);
  common::random_bytes(odd.data(), odd.size());
  common::random_bytes(big.data(), big.size());
  BOOST_TEST(seen.insert(draw()).second);
  BOOST_TEST(std::set<unsigned char>(big.begin(), big.end()).size() > 200u);
}

BOOST_AUTO_TEST_CASE(random_bytes_after_a_fork_differ_in_parent_and_child) {
  draw();  // the buffer is filled before the fork: the child inherits a copy of it
  int fds[2];
  BOOST_TEST_REQUIRE(pipe(fds) == 0);
  const pid_t child = fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    const Token t = draw();
    const auto written = write(fds[1], t.data(), t.size());
    _exit(written == static_cast<ssize_t>(t.size()) ? 0 : 1);
  }
  close(fds[1]);
  const Token mine = draw();
  Token theirs{};
  std::size_t got = 0;
  while (got < theirs.size()) {
    const auto n = read(fds[0], theirs.data() + got, theirs.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  BOOST_TEST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_TEST_REQUIRE(got == theirs.size());
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST((mine != theirs));
}

BOOST_AUTO_TEST_CASE(spec_C16_the_cached_date_is_the_current_second) {
  // Within a second and across a second's boundary: a cached value is never kept past its second.
  const std::string first(common::http_date_now());
  while (common::format_http_date(std::chrono::system_clock::now()) == first) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i = 0; i < 3; ++i) {
    const auto before = common::format_http_date(std::chrono::system_clock::now());
    const std::string cached(common::http_date_now());
    const auto after = common::format_http_date(std::chrono::system_clock::now());
    BOOST_TEST((cached == before || cached == after),
               cached << " is neither " << before << " nor " << after);
  }
}
