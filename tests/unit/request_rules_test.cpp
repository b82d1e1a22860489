// The request-head rules the session applies before routing (SPEC C03, C04; RFC 9112): each
// rule alone, on heads parsed by Beast as the session parses them.
#define BOOST_TEST_MODULE request_rules
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/test/unit_test.hpp>
#include <string>
#include <string_view>

#include "gateway/http/request_rules.hpp"

namespace http = idemgate::http;
namespace bhttp = boost::beast::http;

namespace {

/// The head of `text` as Beast parses it, and the parser's verdict on Transfer-Encoding.
struct Parsed {
  bhttp::request_header<> header;
  bool chunked = false;
};

Parsed parse(std::string_view text) {
  bhttp::request_parser<bhttp::empty_body> parser;
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(text.data(), text.size()), ec);
  BOOST_REQUIRE_MESSAGE(!ec || ec == bhttp::error::need_more, ec.message() << " in " << text);
  BOOST_REQUIRE(parser.is_header_done());
  return {parser.get().base(), parser.chunked()};
}

/// What the session refuses `text` with, as it does it: a head Beast's parser refuses already is
/// mapped by rejection_for, one it takes is checked by check_request_head.
std::optional<http::Rejection> check(std::string_view text) {
  bhttp::request_parser<bhttp::empty_body> parser;
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(text.data(), text.size()), ec);
  if (ec && ec != bhttp::error::need_more) {
    return http::rejection_for(ec, http::Limits{});
  }
  BOOST_REQUIRE(parser.is_header_done());
  auto header = parser.get().base();
  return http::check_request_head(header, parser.chunked());
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C03_an_ordinary_head_passes_unchanged) {
  auto parsed = parse("POST /pay?x=1 HTTP/1.1\r\nHost: api.example\r\nContent-Length: 2\r\n\r\n");
  BOOST_TEST(!http::check_request_head(parsed.header, parsed.chunked));
  BOOST_TEST(parsed.header.target() == "/pay?x=1");
  BOOST_TEST(parsed.header[bhttp::field::host] == "api.example");
}

BOOST_AUTO_TEST_CASE(spec_C03_transfer_encoding_must_be_chunked_alone_on_http11) {
  BOOST_TEST(!check("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const auto last_not_chunked =
      check("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n");
  BOOST_REQUIRE(last_not_chunked);
  BOOST_TEST(static_cast<int>(last_not_chunked->problem) ==
             static_cast<int>(http::Problem::bad_framing));
  BOOST_TEST(last_not_chunked->detail.find("must end with chunked") != std::string::npos);
  const auto gzip = check("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
  BOOST_REQUIRE(gzip);
  BOOST_TEST(gzip->detail == "only the chunked transfer coding is supported, alone");
  const auto twice = check(
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
      "\r\n");
  BOOST_REQUIRE(twice);
  const auto http10 = check("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
  BOOST_REQUIRE(http10);
  BOOST_TEST(static_cast<int>(http10->problem) == static_cast<int>(http::Problem::bad_framing));
}

BOOST_AUTO_TEST_CASE(spec_C03_host_exactly_once_on_http11_at_most_once_on_http10) {
  const auto none = check("GET / HTTP/1.1\r\n\r\n");
  BOOST_REQUIRE(none);
  BOOST_TEST(none->detail == "an HTTP/1.1 request must carry a Host field");
  const auto two = check("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  BOOST_REQUIRE(two);
  BOOST_TEST(two->detail == "the request has more than one Host field");
  BOOST_TEST(!check("GET / HTTP/1.0\r\n\r\n"));
  BOOST_TEST(check("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n").has_value());
}

BOOST_AUTO_TEST_CASE(spec_C03_absolute_form_routes_by_its_authority_in_origin_form) {
  auto parsed =
      parse("GET http://pay.example:8080/v1/charges?id=7 HTTP/1.1\r\nHost: other\r\n\r\n");
  BOOST_TEST(!http::check_request_head(parsed.header, parsed.chunked));
  BOOST_TEST(parsed.header.target() == "/v1/charges?id=7");
  BOOST_TEST(parsed.header[bhttp::field::host] == "pay.example:8080");
  BOOST_TEST(parsed.header.count(bhttp::field::host) == 1U);

  auto bare = parse("GET http://pay.example HTTP/1.1\r\nHost: pay.example\r\n\r\n");
  BOOST_TEST(!http::check_request_head(bare.header, bare.chunked));
  BOOST_TEST(bare.header.target() == "/");

  const auto no_authority = check("GET mailto:a@b HTTP/1.1\r\nHost: a\r\n\r\n");
  BOOST_REQUIRE(no_authority);
  BOOST_TEST(no_authority->detail ==
             "the request target is neither origin-form nor a valid absolute URI");
  BOOST_TEST(!check("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"));

  // A port that is not digits is not a port: the rest is no path either (RFC 3986 §3.2.3, §3.3).
  for (const auto* target : {"http://pay.example::ect?x", "http://pay.example:b/x"}) {
    const auto bad_port = check(std::string("GET ") + target + " HTTP/1.1\r\nHost: a\r\n\r\n");
    BOOST_REQUIRE(bad_port);
    BOOST_TEST(bad_port->detail ==
               "the request target is neither origin-form nor a valid absolute URI");
  }
}

BOOST_AUTO_TEST_CASE(spec_C03_obs_fold_is_found_in_the_header_section_only) {
  BOOST_TEST(http::has_obs_fold("GET / HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n"));
  BOOST_TEST(http::has_obs_fold("GET / HTTP/1.1\r\nX-A: 1\r\n\t2\r\nHost: a\r\n\r\n"));
  BOOST_TEST(!http::has_obs_fold("GET / HTTP/1.1\r\nHost: a\r\n\r\n body that starts with SP"));
  BOOST_TEST(!http::has_obs_fold("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"));
  BOOST_TEST(http::obs_fold_rejection().detail.find("obs-fold") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(spec_C04_parse_errors_map_to_their_problems_and_limits) {
  http::Limits limits;
  limits.max_header_bytes = 2048;
  limits.max_request_body = 4096;
  const auto header = http::rejection_for(bhttp::error::header_limit, limits);
  BOOST_REQUIRE(header);
  BOOST_TEST(static_cast<int>(header->problem) ==
             static_cast<int>(http::Problem::headers_too_large));
  BOOST_TEST(header->detail == "the header section exceeds 2048 bytes");
  const auto body = http::rejection_for(bhttp::error::body_limit, limits);
  BOOST_REQUIRE(body);
  BOOST_TEST(body->detail == "the request body exceeds 4096 bytes");
  const auto framing = http::rejection_for(bhttp::error::multiple_content_length, limits);
  BOOST_REQUIRE(framing);
  BOOST_TEST(static_cast<int>(framing->problem) == static_cast<int>(http::Problem::bad_framing));
  const auto garbage = http::rejection_for(bhttp::error::bad_method, limits);
  BOOST_REQUIRE(garbage);
  BOOST_TEST(static_cast<int>(garbage->problem) == static_cast<int>(http::Problem::bad_request));
  // Errors of the connection itself are answered by nothing.
  BOOST_TEST(!http::rejection_for(bhttp::error::end_of_stream, limits));
  BOOST_TEST(!http::rejection_for(bhttp::error::partial_message, limits));
  BOOST_TEST(!http::rejection_for(boost::asio::error::connection_reset, limits));
}
