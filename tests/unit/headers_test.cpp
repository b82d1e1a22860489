// Hop-by-hop stripping, forwarding fields, list helpers and dates (SPEC C02, C08, C16).
#define BOOST_TEST_MODULE headers
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"

namespace http = idemgate::http;

namespace {

std::vector<std::string> dump(const http::Fields& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields)
    out.push_back(std::string(f.name_string()) + ": " + std::string(f.value()));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C02_strips_fixed_hop_by_hop_fields_and_keeps_the_rest_in_order) {
  http::Fields f;
  f.insert("Host", "example.com:8080");
  f.insert("X-A", "1");
  f.insert("Keep-Alive", "timeout=5");
  f.insert("Proxy-Connection", "keep-alive");
  f.insert("TE", "trailers");
  f.insert("X-A", "2");
  f.insert("Trailer", "X-Checksum");
  f.insert("Transfer-Encoding", "chunked");
  f.insert("Upgrade", "h2c");
  f.insert("Proxy-Authorization", "Basic Zm9vOmJhcg==");
  f.insert("Proxy-Authenticate", "Basic");
  f.insert("Set-Cookie", "a=1");
  f.insert("X-A", "3");
  f.insert("Set-Cookie", "b=2");
  http::strip_hop_by_hop(f);
  // Beast keeps one name's fields together, in arrival order (RFC 9110 §5.3: the order between
  // different names carries no meaning).
  const std::vector<std::string> expected = {
      "Host: example.com:8080", "X-A: 1", "X-A: 2", "X-A: 3", "Set-Cookie: a=1", "Set-Cookie: b=2"};
  BOOST_TEST(dump(f) == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(spec_C02_strips_every_field_named_by_connection_across_repeated_fields) {
  http::Fields f;
  f.insert("Connection", "keep-alive, X-Secret");
  f.insert("x-secret", "s");
  f.insert("Connection", " X-Other ,, close");
  f.insert("X-Other", "o");
  f.insert("X-Kept", "k");
  http::strip_hop_by_hop(f);
  const std::vector<std::string> expected = {"X-Kept: k"};
  BOOST_TEST(dump(f) == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(spec_C02_host_survives_even_when_connection_names_it) {
  http::Fields f;
  f.insert("Host", "example.com");
  f.insert("Connection", "Host");
  http::strip_hop_by_hop(f);
  BOOST_TEST(f["Host"] == "example.com");
  BOOST_TEST(f.count("Connection") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C02_forwarding_fields_append_xff_and_via_and_copy_host) {
  http::Fields f;
  f.insert("Host", "shop.example:8443");
  f.insert("X-Forwarded-For", "203.0.113.7");
  f.insert("X-Forwarded-For", "198.51.100.1");
  f.insert("X-Forwarded-Proto", "gopher");
  f.insert("Via", "1.0 edge");
  http::add_forwarding_fields(f, "127.0.0.1", "http");
  BOOST_TEST(f["X-Forwarded-For"] == "203.0.113.7, 198.51.100.1, 127.0.0.1");
  BOOST_TEST(f.count("X-Forwarded-For") == 1u);
  BOOST_TEST(f["X-Forwarded-Proto"] == "http");
  BOOST_TEST(f["X-Forwarded-Host"] == "shop.example:8443");
  BOOST_TEST(f["Via"] == "1.0 edge, 1.1 idemgate");
  BOOST_TEST(f["Host"] == "shop.example:8443");
}

BOOST_AUTO_TEST_CASE(spec_C02_forwarding_fields_without_prior_values_or_host) {
  http::Fields f;
  f.insert("X-Forwarded-Host", "spoofed");
  http::add_forwarding_fields(f, "::1", "http");
  BOOST_TEST(f["X-Forwarded-For"] == "::1");
  BOOST_TEST(f.count("X-Forwarded-Host") == 0u);
  BOOST_TEST(f["Via"] == "1.1 idemgate");
}

BOOST_AUTO_TEST_CASE(spec_C40_upgrade_names_a_protocol_by_name_without_its_version) {
  http::Fields f;
  BOOST_TEST(!http::upgrade_names(f, "websocket"));  // no Upgrade at all
  f.insert("Upgrade", "h2c");
  BOOST_TEST(!http::upgrade_names(f, "websocket"));
  f.insert("Upgrade", " WebSocket/13 , foo");
  BOOST_TEST(http::upgrade_names(f, "websocket"));
  BOOST_TEST(http::upgrade_names(f, "foo"));
  BOOST_TEST(!http::upgrade_names(f, "web"));
  http::Fields empty_entry;
  empty_entry.insert("Upgrade", "");
  BOOST_TEST(!http::upgrade_names(empty_entry, "websocket"));
}

BOOST_AUTO_TEST_CASE(has_token_reads_every_field_of_the_name_as_a_token_list) {
  http::Fields f;
  f.insert("Vary", " Accept ,, Accept-Encoding");
  f.insert("X-Other", "Origin");
  f.insert("vary", "origin");
  BOOST_TEST(http::has_token(f, "Vary", "ORIGIN"));
  BOOST_TEST(http::has_token(f, "Vary", "accept-encoding"));
  BOOST_TEST(!http::has_token(f, "Vary", "Cookie"));
}

BOOST_AUTO_TEST_CASE(spec_C08_keep_alive_timeout_parameter_is_read) {
  http::Fields f;
  f.insert("Keep-Alive", "max=100, timeout=5");
  BOOST_REQUIRE(http::keep_alive_timeout(f).has_value());
  BOOST_TEST(http::keep_alive_timeout(f)->count() == 5);
  http::Fields quoted;
  quoted.insert("Keep-Alive", "timeout=\"7\"");
  BOOST_TEST(http::keep_alive_timeout(quoted)->count() == 7);
  http::Fields none;
  none.insert("Keep-Alive", "max=3");
  BOOST_TEST(!http::keep_alive_timeout(none).has_value());
  http::Fields bad;
  bad.insert("Keep-Alive", "timeout=soon");
  BOOST_TEST(!http::keep_alive_timeout(bad).has_value());
}

BOOST_AUTO_TEST_CASE(spec_C33_problem_responses_carry_type_title_status_detail) {
  auto res = http::make_problem(http::Problem::route_not_found, "no route for GET /x", 11, true);
  BOOST_TEST(res.result_int() == 404u);
  BOOST_TEST(res[boost::beast::http::field::content_type] == "application/problem+json");
  BOOST_TEST(
      res.body() ==
      R"({"type":"https://idemgate.dev/problems/route-not-found","title":"No route matches the request","status":404,"detail":"no route for GET /x"})");
  BOOST_TEST(res[boost::beast::http::field::content_length] == std::to_string(res.body().size()));
  // A problem answered with another status than its default (as on_mismatch does, C17).
  auto other = http::make_problem(http::describe(http::Problem::bad_request), 422, "d", 11, false);
  BOOST_TEST(other.result_int() == 422u);
  BOOST_TEST(other.body().find("\"status\":422") != std::string::npos);
  BOOST_TEST(other.body().find("/problems/bad-request") != std::string::npos);
  BOOST_TEST(!other.keep_alive());
}

// RFC 9112 §7.1.1 chunk-ext: what Beast 1.81 lets through in a quoted value must be refused.
BOOST_AUTO_TEST_CASE(spec_C03_chunk_extensions_follow_rfc_9112_grammar) {
  for (const std::string ok : {"", ";a", ";a=b", ";a=\"x y\"", ";a=\"x\\\"y\\\\\"", " ; a = b ;c",
                               ";a=\"\"", ";a=\"caf\xc3\xa9\"", ";a=\"tab\there\""}) {
    BOOST_TEST(http::valid_chunk_extensions(ok), ok);
  }
  for (const std::string& bad : std::vector<std::string>{
           ";a=\"x\ny\"", std::string(";a=\"x") + '\0' + "y\"", ";a=\"x\x7fy\"", ";a=\"x\ry\"",
           ";a=\"x\\\ny\"", ";a=\"open", ";a=\"x\\", ";", ";=b", ";a=", ";a b", "a", ";a=b c",
           ";a=\"x\"y", ";a=b\n", ";a@=b"}) {
    BOOST_TEST(!http::valid_chunk_extensions(bad), bad);
  }
}

namespace {

/// What Beast's serializer writes for `header` (its operator<< serializes the header).
template <class Header>
std::string serialized(const Header& header) {
  std::ostringstream out;
  out << header;
  return out.str();
}

/// An HTTP/1.1 POST header for `target` with `Host: host`.
boost::beast::http::request_header<> post_to(std::string_view target, std::string_view host) {
  boost::beast::http::request_header<> req;
  req.method(boost::beast::http::verb::post);
  req.target(target);
  req.version(11);
  req.insert("Host", host);
  return req;
}

template <class Header>
std::string rendered(const Header& header, std::size_t capacity = 4096) {
  std::string out(capacity, '\0');
  out.resize(http::render_head(header, out.data(), out.size()));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_rendered_response_head_is_what_the_serializer_writes) {
  namespace bhttp = boost::beast::http;
  bhttp::response_header<> res;
  res.version(11);
  res.result(201);
  res.insert("Content-Type", "application/json");
  res.insert("X-Empty", "");
  res.insert("Set-Cookie", "a=1");
  res.insert("Set-Cookie", "b=2");
  res.set(bhttp::field::content_length, "67");
  BOOST_TEST(rendered(res) == serialized(res));
  BOOST_TEST(rendered(res).starts_with("HTTP/1.1 201 Created\r\n"));
  res.reason("Made");  // the upstream's own phrase is kept
  res.version(10);
  BOOST_TEST(rendered(res) == serialized(res));
  BOOST_TEST(rendered(res).starts_with("HTTP/1.0 201 Made\r\n"));
  res.reason("");
  res.result(299);  // a status without a standard reason: an empty one (RFC 9112 §4)
  BOOST_TEST(rendered(res).starts_with("HTTP/1.0 299 \r\n"));
  res.result(418);
  BOOST_TEST(rendered(res).starts_with("HTTP/1.0 418 \r\n"));
}

BOOST_AUTO_TEST_CASE(a_rendered_request_head_is_what_the_serializer_writes) {
  auto req = post_to("/pay?x=1", "api.example:8080");
  req.insert("Content-Length", "2");
  BOOST_TEST(rendered(req) == serialized(req));
  req.method_string("PURGE");  // a method Beast does not know
  BOOST_TEST(rendered(req) == serialized(req));
  BOOST_TEST(rendered(req).starts_with("PURGE /pay?x=1 HTTP/1.1\r\n"));
}

BOOST_AUTO_TEST_CASE(a_head_that_does_not_fit_renders_nothing) {
  namespace bhttp = boost::beast::http;
  bhttp::response_header<> res;
  res.result(200);
  res.insert("X-Long", std::string(100, 'x'));
  const std::size_t whole = serialized(res).size();
  BOOST_TEST(rendered(res, whole) == serialized(res));
  BOOST_TEST(rendered(res, whole - 1).empty());
  BOOST_TEST(rendered(res, 0).empty());
}

BOOST_AUTO_TEST_CASE(spec_C02_added_lines_render_after_the_fields_as_the_same_fields_would) {
  // The gateway's fields as added lines: the rendered head is what the serializer writes for
  // the message with those fields inserted, and insert_into() gives the same fields.
  namespace bhttp = boost::beast::http;
  auto req = post_to("/pay", "api.example");
  req.insert("X-Forwarded-For", "203.0.113.7");
  req.insert("X-Forwarded-Proto", "gopher");
  http::AddedFields added;
  http::add_forwarding_fields(req, "127.0.0.1", "http", added);
  BOOST_TEST(added.lines() ==
             "X-Forwarded-Proto: http\r\nX-Forwarded-Host: api.example\r\nVia: 1.1 idemgate\r\n");
  // A field the request carries is changed in place: X-Forwarded-For has the client appended.
  BOOST_TEST(req["X-Forwarded-For"] == "203.0.113.7, 127.0.0.1");
  BOOST_TEST(req.count("X-Forwarded-Proto") == 0u);

  std::string out(4096, '\0');
  out.resize(http::render_head(req, out.data(), out.size(), added.lines()));
  added.insert_into(req);
  BOOST_TEST(out == serialized(req));
  BOOST_TEST(dump(req) ==
             (std::vector<std::string>{
                 "Host: api.example", "X-Forwarded-For: 203.0.113.7, 127.0.0.1",
                 "X-Forwarded-Proto: http", "X-Forwarded-Host: api.example", "Via: 1.1 idemgate"}));
  // The same as the forwarding fields added in place.
  bhttp::request_header<> same;
  same.insert("Host", "api.example");
  same.insert("X-Forwarded-For", "203.0.113.7");
  same.insert("X-Forwarded-Proto", "gopher");
  http::add_forwarding_fields(same, "127.0.0.1", "http");
  BOOST_TEST(dump(same) == dump(req));
}

BOOST_AUTO_TEST_CASE(replace_field_and_append_to_list_add_a_line_only_for_an_absent_field) {
  http::Fields f;
  f.insert("date", "yesterday");
  f.insert("X-Request-Id", "a");
  f.insert("x-request-id", "b");
  f.insert("Via", "1.0 up");
  http::AddedFields added;
  http::replace_field(f, "Date", "today", added);
  http::replace_field(f, "X-Request-Id", "c", added);
  http::append_to_list(f, "Via", "1.1 idemgate", added);
  http::append_to_list(f, "X-Forwarded-For", "::1", added);
  BOOST_TEST(dump(f) == (std::vector<std::string>{"Via: 1.0 up, 1.1 idemgate"}));
  BOOST_TEST(added.lines() == "Date: today\r\nX-Request-Id: c\r\nX-Forwarded-For: ::1\r\n");
  BOOST_TEST(added.has("x-forwarded-for"));
  BOOST_TEST(added.has("DATE"));
  BOOST_TEST(!added.has("Via"));                 // merged into the field, no line
  BOOST_TEST(!added.has("X-Forwarded"));         // a prefix of a line's name
  BOOST_TEST(!added.has("X-Forwarded-For-Ip"));  // longer than a line's name
  added.clear();
  BOOST_TEST(added.empty());
}

BOOST_AUTO_TEST_CASE(fields_are_found_and_erased_by_name_in_any_case) {
  namespace bhttp = boost::beast::http;
  http::Fields f;
  f.insert("Idempotent-Replayed", "true");
  f.insert("Content-Type", "a");
  f.insert("idempotent-replayed", "again");
  f.insert("Idempotency-Status", "x");
  f.insert("Expect", "100-continue");
  BOOST_TEST(http::find_field(f, "IDEMPOTENT-REPLAYED")->value() == "true");
  const auto first = http::find_field(f, "Idempotent-Replayed");
  BOOST_TEST(http::find_next_field(f, first)->value() == "again");
  BOOST_TEST((http::find_next_field(f, http::find_next_field(f, first)) == f.end()));
  BOOST_TEST(http::find_field(f, bhttp::field::content_type)->value() == "a");
  BOOST_TEST((http::find_field(f, bhttp::field::host) == f.end()));
  BOOST_TEST((http::find_field(f, "Idempotent-Replaye") == f.end()));
  http::erase_fields(f, {"Idempotent-Replayed", "idempotency-status", "expect"});
  BOOST_TEST(dump(f) == (std::vector<std::string>{"Content-Type: a"}));
}

BOOST_AUTO_TEST_CASE(spec_C03_content_length_is_set_once_and_kept_when_it_says_so) {
  namespace bhttp = boost::beast::http;
  http::Fields f;
  f.insert("Content-Type", "a");
  f.insert("Content-Length", "3");
  f.insert("X-After", "b");
  http::set_content_length(f, 3);  // says so already: kept in its place
  BOOST_TEST(dump(f) ==
             (std::vector<std::string>{"Content-Type: a", "Content-Length: 3", "X-After: b"}));
  f.insert("Content-Length", "3");  // a list of equal lengths becomes the one value
  http::set_content_length(f, 3);
  BOOST_TEST(f.count(bhttp::field::content_length) == 1u);
  BOOST_TEST(f[bhttp::field::content_length] == "3");
  http::set_content_length(f, 18446744073709551615ULL);
  BOOST_TEST(f[bhttp::field::content_length] == "18446744073709551615");
  http::Fields none;
  http::set_content_length(none, 0);
  BOOST_TEST(none[bhttp::field::content_length] == "0");
}

BOOST_AUTO_TEST_CASE(spec_C02_keep_alive_is_set_as_beast_sets_it) {
  namespace bhttp = boost::beast::http;
  for (const unsigned version : {10u, 11u}) {
    for (const bool keep_alive : {false, true}) {
      for (const char* connection : {"", "close", "keep-alive", "upgrade"}) {
        bhttp::response<bhttp::empty_body> ours;
        ours.version(version);
        if (*connection != '\0') ours.set(bhttp::field::connection, connection);
        auto beasts = ours;
        http::set_keep_alive(ours, keep_alive);
        beasts.keep_alive(keep_alive);
        BOOST_TEST(dump(ours) == dump(beasts), version << " " << keep_alive << " " << connection);
        BOOST_TEST(ours.keep_alive() == keep_alive);
      }
    }
  }
}
