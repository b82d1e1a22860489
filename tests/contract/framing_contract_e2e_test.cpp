// Request smuggling and ambiguous framing through the gateway (SPEC C03, RFC 9112 §6.3 and
// §11.2), over raw client sockets. Every hostile request hides a second request
// (`GET /smuggled`) where a parser that disagrees with the gateway's would find it; the in-test
// upstream counts what reaches it, so a request forwarded twice or in a smuggled form shows.
#define BOOST_TEST_MODULE framing_contract_e2e
#include <boost/test/unit_test.hpp>
#include <cstdio>

#include "tests/contract/contract_support.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;

const std::string kSmuggled = "GET /smuggled HTTP/1.1\r\nHost: gateway.test\r\n\r\n";

/// A gateway with a keyed route on /keyed (held requests) and a pass-through route for every
/// other path (streamed requests), both to the in-test upstream.
struct FramingFixture {
  TestUpstream upstream;
  Gateway gateway{[this] {
    GatewayConfig config;
    config.upstreams = {{"up", {upstream.address()}}};
    config.routes = {route("keyed", "/keyed", "up"), route("all", "/", "up", "off")};
    return config;
  }()};

  /// Expects exactly one response, a 400 (or one of `statuses`) problem, and the connection
  /// closed after it: nothing behind the rejected request is read as a request.
  void expect_rejected_and_closed(const std::string& name, const std::string& bytes,
                                  std::initializer_list<unsigned> statuses = {400}) {
    BOOST_TEST_CONTEXT(name) {
      const RawExchange got = raw_exchange(gateway.port(), bytes);
      BOOST_TEST_REQUIRE(got.responses.size() == 1u, got.responses.size()
                                                         << " responses; unparsed: " << got.rest);
      const HttpResponse& res = got.responses.front();
      bool expected = false;
      for (const unsigned s : statuses)
        expected = expected || static_cast<bool>(is_problem(res, s));
      BOOST_TEST(expected, describe(res));
      BOOST_TEST(!res.keep_alive, describe(res));
      BOOST_TEST(got.rest.empty(), "bytes after the response: " << got.rest);
      BOOST_TEST(got.closed, "the connection stayed open");
    }
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(framing, FramingFixture)

BOOST_AUTO_TEST_CASE(spec_C03_content_length_with_transfer_encoding_is_400_and_closes) {
  // CL.TE: a front end that reads Content-Length forwards "0\r\n\r\n" plus the smuggled
  // request as body; one that reads chunked sees the smuggled request next.
  const std::string chunked_end = "0\r\n\r\n";
  expect_rejected_and_closed("Content-Length then Transfer-Encoding",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                                 std::to_string(chunked_end.size() + kSmuggled.size()) +
                                 "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_end +
                                 kSmuggled);
  // TE.CL: the reverse order.
  expect_rejected_and_closed("Transfer-Encoding then Content-Length",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "chunked\r\nContent-Length: 4\r\n\r\n5c\r\n" +
                                 kSmuggled + "\r\n0\r\n\r\n");
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_two_different_content_lengths_are_400_and_close) {
  expect_rejected_and_closed("two fields",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 0\r\n"
                             "Content-Length: " +
                                 std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled);
  expect_rejected_and_closed("one list",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 0, " +
                                 std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled);
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_transfer_encoding_not_ending_in_chunked_is_400_and_closes) {
  expect_rejected_and_closed("chunked, identity",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "chunked, identity\r\n\r\n0\r\n\r\n" +
                                 kSmuggled);
  expect_rejected_and_closed("unknown coding",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "xchunked\r\n\r\n0\r\n\r\n" +
                                 kSmuggled);
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_obs_fold_header_line_is_400) {
  // RFC 9112 §5.2: a server rejects obs-fold with 400 (or replaces it by spaces). A fold inside
  // a framing field is where parsers disagree, so the gateway refuses any fold.
  expect_rejected_and_closed("folded field",
                             "GET /a HTTP/1.1\r\nHost: gateway.test\r\nX-Folded: a\r\n b\r\n\r\n");
  expect_rejected_and_closed("folded Transfer-Encoding",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                                 std::to_string(5 + kSmuggled.size()) +
                                 "\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + kSmuggled);
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_bare_lf_line_endings_never_forward_a_smuggled_request) {
  // Decision: a bare LF does not end a line (RFC 9112 §2.2 allows, never requires, accepting
  // it): Beast's parser refuses it on the request line ("bad version") and inside a field ("bad
  // value"), so the gateway answers 400 and closes, and no LF-split text is ever read as a
  // request of its own.
  expect_rejected_and_closed("bare LF line endings only",
                             "GET /lf HTTP/1.1\nHost: gateway.test\n\nGET /smuggled HTTP/1.1\n\n");
  expect_rejected_and_closed(
      "bare LF inside a field",
      "GET /a HTTP/1.1\r\nHost: gateway.test\nX-Smuggle: x\r\nContent-Length: 0\r\n\r\n");
  expect_rejected_and_closed("bare LF before a hidden request line",
                             "POST /a HTTP/1.1\r\nHost: gateway.test\r\nX-A: 1\n"
                             "Content-Length: 0\n\nGET /smuggled HTTP/1.1\r\n\r\n");
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_huge_chunk_size_is_rejected_and_closes) {
  expect_rejected_and_closed(
      "ffffffffffffffff",
      "POST /a HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n"
      "ffffffffffffffff\r\nabc\r\n0\r\n\r\n" +
          kSmuggled,
      {400, 413});
  expect_rejected_and_closed(
      "overflowing",
      "POST /a HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10000000000000001\r\nabc\r\n0\r\n\r\n" +
          kSmuggled,
      {400, 413});
  BOOST_TEST(upstream.total() == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_a_request_in_a_body_stays_body_and_pipelining_forwards_each_once) {
  // Well-framed bodies that contain request text arrive as body; the upstream sees one request
  // per client request, never the hidden one.
  auto connection = gateway.connect();
  connection->send_raw("POST /cl HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: " +
                       std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled);
  const HttpResponse cl = connection->read_response();
  BOOST_TEST(cl.status == 201u, describe(cl));
  const std::string chunk = kSmuggled;
  char size[32];
  std::snprintf(size, sizeof size, "%zx", chunk.size());
  connection->send_raw(
      "POST /chunked HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
      "chunked\r\n\r\n" +
      std::string(size) + "\r\n" + chunk + "\r\n0\r\n\r\n" +
      // A pipelined request right behind it is a request of its own.
      "GET /next HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
  const HttpResponse chunked = connection->read_response();
  BOOST_TEST(chunked.status == 201u, describe(chunked));
  const HttpResponse next = connection->read_response();
  BOOST_TEST(next.status == 201u, describe(next));

  BOOST_TEST(upstream.count("/smuggled") == 0u);
  BOOST_TEST(upstream.count("/cl") == 1u);
  BOOST_TEST(upstream.count("/chunked") == 1u);
  BOOST_TEST(upstream.count("/next") == 1u);
  BOOST_TEST(upstream.total() == 3u);
  BOOST_TEST_REQUIRE(upstream.count("/cl") == 1u);
  BOOST_TEST(upstream.received("/cl").front().body == kSmuggled);
  BOOST_TEST(upstream.received("/chunked").front().body == kSmuggled);
}

BOOST_AUTO_TEST_CASE(spec_C04_oversized_trailers_and_chunk_extensions_are_refused_and_close) {
  // Beast holds a whole chunk-size line or trailer section in memory before parsing it: both
  // must stay within the header limits, or one client could grow the gateway without bound.
  std::string trailers;
  for (int i = 0; i < 20000; ++i) trailers += "T: xxxxx\r\n";
  expect_rejected_and_closed("trailers",
                             "POST /t HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "chunked\r\n\r\n1\r\na\r\n0\r\n" +
                                 trailers + "\r\n",
                             {431, 400});
  expect_rejected_and_closed("chunk extension",
                             "POST /t HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "chunked\r\n\r\n1;" +
                                 std::string(200000, 'e') + "\r\na\r\n0\r\n\r\n",
                             {431, 400});
  BOOST_TEST(upstream.count("/t") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_quoted_chunk_extension_with_lf_nul_or_del_is_400_and_closes) {
  // RFC 9112 §7.1.1: a quoted chunk-ext value holds qdtext and quoted-pairs only. A front proxy
  // that reads the bare LF as a line end would find the smuggled request where the gateway
  // reads chunk data.
  for (const std::string& bad :
       {std::string("\n"), std::string(1, '\0'), std::string("\x7f"), std::string("\\\n")}) {
    const std::string ext = ";a=\"x" + bad + "y\"";
    expect_rejected_and_closed("in a chunk: " + ext,
                               "POST /ext HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                               "chunked\r\n\r\n5" +
                                   ext + "\r\nhello\r\n0\r\n\r\n" + kSmuggled);
    expect_rejected_and_closed("in the last chunk: " + ext,
                               "POST /ext HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                               "chunked\r\n\r\n5\r\nhello\r\n0" +
                                   ext + "\r\n\r\n" + kSmuggled);
  }
  BOOST_TEST(upstream.count("/ext") == 0u);
  BOOST_TEST(upstream.count("/smuggled") == 0u);

  // Well-formed extensions, quoted-pairs included, are still read (and dropped by the re-framing).
  const RawExchange ok =
      raw_exchange(gateway.port(),
                   "POST /ext-ok HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n"
                   "Connection: close\r\n\r\n5;a=\"x y\\\"z\";b=tok\r\nhello\r\n0;last\r\n\r\n");
  BOOST_TEST_REQUIRE(ok.responses.size() == 1u);
  BOOST_TEST(ok.responses.front().status == 201u, describe(ok.responses.front()));
  BOOST_TEST_REQUIRE(upstream.count("/ext-ok") == 1u);
  BOOST_TEST(upstream.received("/ext-ok").front().body == "hello");
}

BOOST_AUTO_TEST_CASE(spec_C03_transfer_codings_other_than_chunked_are_refused) {
  // "gzip, chunked" would reach the upstream still gzip-coded but without saying so.
  expect_rejected_and_closed("gzip, chunked",
                             "POST /gz HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: gzip, "
                             "chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
  expect_rejected_and_closed("two fields",
                             "POST /gz HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                             "gzip\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
  BOOST_TEST(upstream.count("/gz") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C01_host_must_be_single_and_present_on_http_1_1) {
  expect_rejected_and_closed("two Host fields",
                             "POST /h HTTP/1.1\r\nHost: other\r\nHost: gateway.test\r\n"
                             "Content-Length: 0\r\n\r\n");
  expect_rejected_and_closed("no Host", "POST /h HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  BOOST_TEST(upstream.count("/h") == 0u);
}

BOOST_AUTO_TEST_CASE(absolute_form_targets_are_routed_and_forwarded_by_their_authority) {
  // RFC 9112 §3.2.2: the target's authority wins over Host.
  const RawExchange got =
      raw_exchange(gateway.port(),
                   "POST http://gateway.test/abs?x=1 HTTP/1.1\r\nHost: other\r\nContent-Length: "
                   "0\r\nConnection: close\r\n\r\n");
  BOOST_TEST_REQUIRE(got.responses.size() == 1u);
  BOOST_TEST(got.responses.front().status == 201u, describe(got.responses.front()));
  BOOST_TEST_REQUIRE(upstream.count("/abs") == 1u);
  const auto seen = upstream.received("/abs").front();
  BOOST_TEST(seen.target == "/abs?x=1");
  BOOST_TEST(seen.values("Host").size() == 1u);
  BOOST_TEST(seen.value("Host").value_or("") == "gateway.test");
}

BOOST_AUTO_TEST_CASE(spec_C03_chunk_lines_ending_in_a_bare_lf_are_400_at_once) {
  // RFC 9112 §7.1: chunk-size lines and trailer lines end in CRLF. A body whose lines end in LF
  // alone is refused as soon as the line is there, not left waiting for a CRLF until idle_timeout.
  for (const std::string& lines : {std::string("3\nabc\n0\n\n"), std::string("3\r\nabc\r\n0\n\n"),
                                   std::string("0\r\nX-T: a\n\r\n")}) {
    expect_rejected_and_closed("streamed: " + lines,
                               "POST /lf HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: "
                               "chunked\r\n\r\n" +
                                   lines);
    expect_rejected_and_closed(
        "held: " + lines, "POST /keyed/lf HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " +
                              unique_name("lf") + "\r\nTransfer-Encoding: chunked\r\n\r\n" + lines);
  }
  BOOST_TEST(upstream.count("/keyed/lf") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C03_upstream_trailers_never_become_response_header_fields) {
  // A chunked answer that arrives whole, its trailer section included: the trailers are dropped,
  // on the streamed and the held path alike, never written as header fields (C16:
  // Idempotent-Replayed is the gateway's own).
  UpstreamReply reply;
  reply.headers = {{"Transfer-Encoding", "chunked"}};
  reply.body =
      "2\r\nok\r\n0\r\nSet-Cookie: evil=1\r\nIdempotent-Replayed: true\r\nLocation: "
      "http://evil/\r\n\r\n";
  upstream.on("/trailers", {reply});
  upstream.on("/keyed/trailers", {reply});
  for (const std::string& request :
       {std::string("GET /trailers HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n"),
        "POST /keyed/trailers HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " +
            unique_name("trailers") + "\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"}) {
    BOOST_TEST_CONTEXT(request) {
      const RawExchange got = raw_exchange(gateway.port(), request);
      BOOST_TEST_REQUIRE(got.responses.size() == 1u, "unparsed: " << got.rest);
      const HttpResponse& res = got.responses.front();
      BOOST_TEST(res.status == 201u, describe(res));
      BOOST_TEST(res.body == "ok");
      for (const char* name : {"Set-Cookie", "Idempotent-Replayed", "Location"})
        BOOST_TEST(!res.header(name), name << " came through: " << describe(res));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C02_close_in_any_connection_field_line_closes_after_the_answer) {
  // RFC 9110 §7.6.1: Connection is a list that may span several field lines.
  for (const std::string& request :
       {std::string("GET /conn HTTP/1.1\r\nHost: gateway.test\r\nConnection: x-a\r\n"
                    "Connection: close\r\n\r\n"),
        "POST /keyed/conn HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: " +
            unique_name("conn") +
            "\r\nConnection: x-a\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"}) {
    BOOST_TEST_CONTEXT(request) {
      const RawExchange got = raw_exchange(gateway.port(), request, std::chrono::seconds(3));
      BOOST_TEST_REQUIRE(got.responses.size() == 1u, "unparsed: " << got.rest);
      const HttpResponse& res = got.responses.front();
      BOOST_TEST(res.status == 201u, describe(res));
      BOOST_TEST(res.header("Connection").value_or("") == "close", describe(res));
      BOOST_TEST(got.closed, "the connection stayed open");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
