// Request identity (SPEC §4): which inputs change the fingerprint and the scope, and which do not.
// The exact values are pinned by tests/unit/known_answer_test.cpp.
#define BOOST_TEST_MODULE fingerprint
#include "gateway/core/fingerprint.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#include "gateway/common/use_nothrow.hpp"
#include "gateway/config/config.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/request_identity.hpp"

using namespace idemgate::core;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace config = idemgate::config;

namespace {

Sha256 fp(std::string_view method, std::string_view target, std::string_view content_type,
          std::string_view body, BodyMode mode = BodyMode::bytes) {
  std::vector<HeaderValues> headers = {{"Content-Type", {content_type}}};
  return compute_fingerprint(method, target, headers, body, mode);
}

/// An in-memory peer for the session's body reader: Beast's test stream, plus the expiry the
/// reader sets before each read on a TCP stream (nothing can time out here).
class MemoryStream : public beast::test::stream {
 public:
  using beast::test::stream::stream;
  void expires_after(std::chrono::steady_clock::duration) {}
};

/// The request the HTTP layer hands to the idempotency handler for `wire` (a whole HTTP/1.1
/// request), read as the session reads it: the header with async_read_header, the body with
/// async_read_body (gateway/http/body_reader.hpp), from a peer that delivers at most
/// `read_size` bytes per read.
bhttp::request<bhttp::string_body> receive(std::string_view wire, std::size_t read_size) {
  asio::io_context io;
  MemoryStream stream(io);
  stream.append(wire);
  stream.read_size(read_size);
  stream.close_remote();
  bhttp::request_parser<bhttp::string_body> parser;
  parser.body_limit(boost::none);
  idemgate::http::check_chunk_extensions(parser);
  beast::flat_buffer buffer;
  auto read = [&]() -> asio::awaitable<boost::system::error_code> {
    auto [ec, n] =
        co_await bhttp::async_read_header(stream, buffer, parser, idemgate::common::use_nothrow);
    if (ec) co_return ec;
    co_return co_await idemgate::http::async_read_body(stream, buffer, parser,
                                                       std::chrono::seconds(1));
  };
  auto done = asio::co_spawn(io, read(), asio::use_future);
  io.run();
  const boost::system::error_code ec = done.get();
  BOOST_TEST_REQUIRE(!ec, ec.message());
  BOOST_TEST_REQUIRE(parser.is_done());
  BOOST_TEST_REQUIRE(buffer.size() == 0u, "bytes left after the request");
  return parser.release();
}

/// One chunk of a chunked body: size in upper-case hex, `extension`, CRLF, data, CRLF.
std::string chunk(std::string_view data, std::string_view extension = "") {
  char size[20];
  std::snprintf(size, sizeof size, "%zX", data.size());
  return std::string(size) + std::string(extension) + "\r\n" + std::string(data) + "\r\n";
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C27_content_length_and_chunked_bodies_have_the_same_fingerprint) {
  // JSON whose white space holds the bytes of a last chunk ("\r\n0\r\n\r\n"): it must come
  // through unchanged either way, and stay JSON for fingerprint_body: json.
  const std::string body =
      "{\"amount\":\"10.00\",\"n\":[1\r\n,\r\n0\r\n\r\n],\"memo\":\"a\\r\\nb\"}";
  BOOST_TEST_REQUIRE(canonical_json(body).has_value());
  const std::string head =
      "POST /payments?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n";
  const std::string with_length =
      head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  // Uneven chunks, an upper-case hex size, a chunk extension and a trailer field.
  const std::string chunked = head + "Transfer-Encoding: chunked\r\n\r\n" +
                              chunk(body.substr(0, 1)) + chunk(body.substr(1, 26), ";ext=1") +
                              chunk(body.substr(27)) + "0\r\nX-Trailer: t\r\n\r\n";

  for (const auto mode : {config::FingerprintBody::bytes, config::FingerprintBody::json}) {
    config::Idempotency idem;  // fingerprint.headers: Content-Type, Content-Encoding
    idem.fingerprint_body = mode;
    const std::vector<HeaderValues> headers = {{"Content-Type", {"application/json"}},
                                               {"Content-Encoding", {}}};
    const Sha256 expected = compute_fingerprint(
        "POST", "/payments?x=1", headers, body,
        mode == config::FingerprintBody::json ? BodyMode::json : BodyMode::bytes);
    for (const std::size_t read_size : {std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
      BOOST_TEST_CONTEXT("json mode " << (mode == config::FingerprintBody::json) << ", "
                                      << read_size << " bytes per read") {
        const auto by_length = receive(with_length, read_size);
        const auto by_chunks = receive(chunked, read_size);
        BOOST_TEST(by_length.body() == body);
        BOOST_TEST(by_chunks.body() == body);
        BOOST_TEST(to_hex(idemgate::request_fingerprint(idem, by_length)) == to_hex(expected));
        BOOST_TEST(to_hex(idemgate::request_fingerprint(idem, by_chunks)) == to_hex(expected));
      }
    }
  }
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
  // Not JSON: hashed exactly as bytes mode hashes it, so white space counts again.
  for (const std::string_view body : {"not json", "", "{\"a\":", "\"\xff\""}) {
    BOOST_TEST_CONTEXT("body '" << body << "'") {
      BOOST_TEST(fp("POST", "/e", "", body, BodyMode::json) ==
                 fp("POST", "/e", "", body, BodyMode::bytes));
    }
  }
  BOOST_TEST(fp("POST", "/e", "", "not json", BodyMode::json) !=
             fp("POST", "/e", "", "not  json", BodyMode::json));
  // A JSON body is not hashed as its bytes, even when they are already canonical.
  BOOST_TEST(fp("POST", "/e", "", R"({"a":1})", BodyMode::json) !=
             fp("POST", "/e", "", R"({"a":1})", BodyMode::bytes));
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
  // Keys are compared exactly (C28): another case is another record.
  BOOST_TEST(record_id(compute_scope("payments", alice), "k") !=
             record_id(compute_scope("payments", alice), "K"));
}

BOOST_AUTO_TEST_CASE(spec_C20_scope_headers_are_found_by_case_insensitive_name) {
  // The request spells the configured field name differently: the same client, the same scope.
  bhttp::fields lower;
  lower.insert("authorization", "Bearer alice");
  bhttp::fields upper;
  upper.insert("AUTHORIZATION", "Bearer alice");
  config::Route route;
  route.name = "payments";
  config::contract_of(route).idempotency.key_scope_headers = {"Authorization"};
  std::vector<HeaderValues> alice = {{"Authorization", {"Bearer alice"}}};
  BOOST_TEST(to_hex(idemgate::request_scope(route, lower)) ==
             to_hex(compute_scope("payments", alice)));
  BOOST_TEST(to_hex(idemgate::request_scope(route, upper)) ==
             to_hex(compute_scope("payments", alice)));
}

BOOST_AUTO_TEST_CASE(canonical_json_sorts_members_and_strips_space) {
  BOOST_TEST(*canonical_json(R"( { "b" : "x y", "a" : null } )") == R"({"a":null,"b":"x y"})");
  BOOST_TEST(!canonical_json("{").has_value());
}
