// Fuzz target for reading an upstream's response (SPEC C03, C08, C16): what a hostile or broken
// upstream can send on a connection after the gateway's request. The first byte is the request:
// bit 0 set means HEAD. The rest is every byte the upstream sends before it closes the
// connection. The bytes go through the pool's rules (gateway/http/upstream_response.hpp): one
// parser per response as the pool sets it up, interim responses dropped, 101 refused, then the
// final response's body and the forwarded response with its reuse decision.
// Hand-written seeds start with '0' (a GET or POST) or '1' (HEAD).

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz/check.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/upstream_response.hpp"

namespace bhttp = boost::beast::http;
namespace http = idemgate::http;
using idemgate::fuzz::check;

namespace {

// Small, so that the fuzzer reaches the body limit with short inputs.
constexpr std::size_t kMaxBody = 4096;

constexpr std::string_view kHopByHop[] = {
    "Connection",          "Keep-Alive",         "Proxy-Connection", "TE", "Trailer", "Upgrade",
    "Proxy-Authorization", "Proxy-Authenticate", "Transfer-Encoding"};

/// Feeds `input` from `used` on to `parser` until `done(parser)`, as Beast's reads do from a
/// buffer that already holds every byte the upstream sent: after need_more the upstream has
/// closed, so the parser gets EOF (never the same bytes again, on which Beast asserts).
template <class Done>
boost::system::error_code feed(http::ResponseParser& parser, std::string_view input,
                               std::size_t& used, Done done) {
  boost::system::error_code ec;
  while (!done(parser)) {
    if (used == input.size()) {
      // Beast's read: EOF before any byte of this message is end_of_stream, else put_eof.
      if (!parser.got_some()) return bhttp::error::end_of_stream;
      parser.put_eof(ec);
      return ec;
    }
    const std::size_t n =
        parser.put(boost::asio::buffer(input.data() + used, input.size() - used), ec);
    used += n;
    check(used <= input.size(), "the parser consumed no more than it was given");
    if (ec == bhttp::error::need_more) {
      parser.put_eof(ec);
      return ec;
    }
    if (ec) return ec;
    if (n == 0 && !done(parser)) {
      parser.put_eof(ec);
      return ec;
    }
  }
  return ec;
}

void check_forwarded(const http::UpstreamResponse& out, const http::ResponseParser& parser,
                     const bhttp::response_header<>& header, bool head, std::size_t buffered) {
  const http::Response& res = out.response;
  const unsigned status = res.result_int();
  check(status >= 200 && status <= 999, "a final response has a 3-digit status of 200 or more");
  check(status == header.result_int(), "the status is the upstream's");
  check(res.version() == 11, "forwarded as HTTP/1.1");
  check(res.body().size() <= kMaxBody, "the body is within max_response_body");
  if (head) check(res.body().empty(), "no body after HEAD");
  if (!http::status_has_body(status)) check(res.body().empty(), "no body for 1xx/204/304");
  if (!head) {
    if (http::status_has_body(status)) {
      check(res.has_content_length() && res.payload_size() == res.body().size() &&
                res.count(bhttp::field::content_length) == 1,
            "Content-Length is the decoded body size");
    } else {
      check(res.count(bhttp::field::content_length) == 0, "no Content-Length without a body");
    }
  }
  for (const auto field : kHopByHop) check(res.count(field) == 0, "hop-by-hop field stripped");
  for (const auto& field : header) {
    if (field.name() != bhttp::field::connection) continue;
    for (const auto& name : bhttp::token_list(field.value())) {
      if (!boost::beast::iequals(name, "Host")) {
        check(res.count(name) == 0, "fields named by Connection stripped");
      }
    }
  }
  // Trailers are dropped: every forwarded field was in the header section.
  std::size_t fields = 0;
  for (const auto& f : res) {
    (void)f;
    ++fields;
  }
  std::size_t header_fields = 0;
  for (const auto& f : header) {
    (void)f;
    ++header_fields;
  }
  check(fields <= header_fields + 1, "no field beyond the header section and Content-Length");
  if (out.reusable) {
    check(parser.keep_alive() && !parser.need_eof() && buffered == 0,
          "a reusable connection is kept alive, not delimited by EOF, and has no extra bytes");
  }
  if (parser.need_eof()) check(!out.reusable, "a body read to EOF ends the connection");
  if (out.keep_alive) check(out.keep_alive->count() >= 0, "Keep-Alive timeout is not negative");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool head = (data[0] & 1) != 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::size_t used = 0;

  // As UpstreamPool's exchange: one parser per response until a final one.
  std::optional<http::ResponseParser> next;
  for (;;) {
    http::ResponseParser& parser = next.emplace();
    http::prepare_response_parser(parser, head, kMaxBody);
    const std::size_t before = used;
    const auto ec = feed(parser, input, used, [](const auto& p) { return p.is_header_done(); });
    if (ec) return 0;  // unknown_outcome (or stale)
    check(used > before, "a response header takes bytes");
    const unsigned status = parser.get().result_int();
    check(status <= 999, "a status is three digits");
    const auto verdict = http::classify_response_header(status);
    if (verdict == http::ResponseHeaderVerdict::refused) {
      check(status == 101, "only 101 is refused");
      return 0;
    }
    if (verdict == http::ResponseHeaderVerdict::bad_status) {
      check(status < 100, "only a status under 100 is bad");
      return 0;
    }
    if (verdict == http::ResponseHeaderVerdict::interim) {
      check(status >= 100 && status < 200, "only a 1xx status is interim");
      // The next response starts where this header ended: an interim response has no body.
      check(parser.is_done(), "an interim response ends with its header");
      continue;
    }
    check(status >= 200, "a final response has status 200 or more");

    auto header = parser.get().base();
    parser.eager(true);  // as beast::http::async_read
    const auto body_ec = feed(parser, input, used, [](const auto& p) { return p.is_done(); });
    if (body_ec) {
      if (body_ec == bhttp::error::body_limit) {
        check(!head && http::status_has_body(status), "only a body can be over the limit");
      }
      return 0;  // unknown_outcome
    }
    check(parser.is_done(), "a response read without error is complete");
    const std::size_t buffered = input.size() - used;
    auto out = http::finish_upstream_response(parser, header, head, buffered);
    check_forwarded(out, parser, header, head, buffered);
    return 0;
  }
}
