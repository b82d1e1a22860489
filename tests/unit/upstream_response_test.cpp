// The rules for reading an upstream's response (gateway/http/upstream_response.hpp; SPEC C03,
// C08): what a response header means, and what is forwarded of a complete response.
#define BOOST_TEST_MODULE upstream_response
#include <boost/asio/buffer.hpp>
#include <boost/test/unit_test.hpp>
#include <string_view>

#include "gateway/http/upstream_response.hpp"

namespace http = idemgate::http;
using Verdict = http::ResponseHeaderVerdict;

namespace {

/// Parses `bytes` (all the upstream sent) as the pool's parser for a GET; returns bytes used.
std::size_t parse(http::ResponseParser& parser, std::string_view bytes) {
  http::prepare_response_parser(parser, false, 1024);
  boost::system::error_code ec;
  const auto n = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
  BOOST_REQUIRE(!ec);
  BOOST_REQUIRE(parser.is_header_done());
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(statuses_are_interim_final_or_fail_the_exchange) {
  BOOST_TEST((http::classify_response_header(100) == Verdict::interim));
  BOOST_TEST((http::classify_response_header(103) == Verdict::interim));
  BOOST_TEST((http::classify_response_header(101) == Verdict::refused));
  BOOST_TEST((http::classify_response_header(200) == Verdict::final_response));
  BOOST_TEST((http::classify_response_header(599) == Verdict::final_response));
}

// Found by the upstream_response fuzz target: Beast reads "099" as a status, and frames its
// message by Content-Length like any final response. Taken as interim, its body was parsed as
// the next response: an upstream could make the gateway forward bytes of a body as a response.
BOOST_AUTO_TEST_CASE(a_status_under_100_fails_the_exchange_instead_of_being_skipped) {
  http::ResponseParser parser;
  parse(parser,
        "HTTP/1.1 099 Odd\r\nContent-Length: 38\r\n\r\n"
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  BOOST_TEST(parser.get().result_int() == 99u);
  BOOST_TEST(!parser.is_done());  // its body follows: it is no interim response
  BOOST_TEST((http::classify_response_header(99) == Verdict::bad_status));
  BOOST_TEST((http::classify_response_header(0) == Verdict::bad_status));
}

BOOST_AUTO_TEST_CASE(spec_C03_only_chunked_alone_is_a_transfer_coding_the_gateway_reads) {
  const auto detail_for = [](std::initializer_list<std::string_view> values) {
    boost::beast::http::response_header<> header;
    for (const auto v : values) header.insert(boost::beast::http::field::transfer_encoding, v);
    return http::unsupported_transfer_coding(header);
  };
  BOOST_TEST(detail_for({}).empty());
  BOOST_TEST(detail_for({"chunked"}).empty());
  BOOST_TEST(detail_for({"Chunked"}).empty());
  BOOST_TEST(detail_for({"gzip, chunked"}) ==
             "the upstream's response uses a transfer coding the gateway does not decode "
             "(Transfer-Encoding: gzip, chunked); only chunked is supported");
  BOOST_TEST(!detail_for({"gzip"}).empty());
  BOOST_TEST(!detail_for({"chunked, chunked"}).empty());
  BOOST_TEST(!detail_for({"gzip", "chunked"}).empty());
  BOOST_TEST(!detail_for({""}).empty());
  BOOST_TEST(detail_for({" CHUNKED\t"}).empty());
  for (const auto junk : {"chunked ;, gzip", "chunked gzip", "chunked;q=1", "chunked,", ",chunked"})
    BOOST_TEST(!detail_for({junk}).empty(), junk);
}

BOOST_AUTO_TEST_CASE(an_interim_response_ends_with_its_header) {
  http::ResponseParser parser;
  const std::string_view bytes =
      "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\nHTTP/1.1 201 Created\r\n\r\n";
  const auto used = parse(parser, bytes);
  BOOST_TEST(parser.is_done());
  BOOST_TEST(bytes.substr(used).starts_with("HTTP/1.1 201"));
}

BOOST_AUTO_TEST_CASE(the_forwarded_response_is_framed_by_its_decoded_body) {
  http::ResponseParser parser;
  const std::string_view bytes =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: X-Hop\r\nX-Hop: 1\r\n"
      "X-End: kept\r\n\r\n"
      "3;ext=1\r\nabc\r\n0\r\nX-Trailer: dropped\r\n\r\n";
  const auto used = parse(parser, bytes);
  auto header = parser.get().base();
  parser.eager(true);
  boost::system::error_code ec;
  const auto rest = bytes.substr(used);
  parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
  BOOST_REQUIRE(!ec);
  BOOST_REQUIRE(parser.is_done());
  auto out = http::finish_upstream_response(parser, std::move(header), false, 0);
  BOOST_TEST(out.reusable);
  BOOST_TEST(out.response.body() == "abc");
  BOOST_TEST(out.response[boost::beast::http::field::content_length] == "3");
  BOOST_TEST(out.response.count(boost::beast::http::field::transfer_encoding) == 0u);
  BOOST_TEST(out.response.count("X-Hop") == 0u);
  BOOST_TEST(out.response.count("X-Trailer") == 0u);
  BOOST_TEST(out.response["X-End"] == "kept");
}
