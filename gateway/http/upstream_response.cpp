#include "gateway/http/upstream_response.hpp"

#include <boost/asio/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <utility>

#include "gateway/common/ows.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/http/headers.hpp"

namespace idemgate::http {

namespace bhttp = boost::beast::http;

void prepare_response_parser(ResponseParser& parser, bool head, std::size_t max_body) {
  parser.header_limit(kMaxResponseHeaderBytes);
  parser.body_limit(max_body);
  parser.skip(head);
  check_chunk_extensions(parser);  // RFC 9112 §7.1.1
}

void prepare_response_parser(StreamResponseParser& parser, bool head) {
  parser.header_limit(kMaxResponseHeaderBytes);
  parser.body_limit(boost::none);
  parser.skip(head);
  check_chunk_extensions(parser);
}

bool closed_before_answer(const boost::system::error_code& ec) {
  namespace asio = boost::asio;
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted;
}

ResponseHeaderVerdict classify_response_header(unsigned status) {
  if (status < 100) return ResponseHeaderVerdict::bad_status;
  if (status == 101) return ResponseHeaderVerdict::refused;
  if (status >= 200) return ResponseHeaderVerdict::final_response;
  return ResponseHeaderVerdict::interim;  // 1xx interim responses are not forwarded
}

std::string unsupported_transfer_coding(const bhttp::response_header<>& header) {
  const auto fields = header.count(bhttp::field::transfer_encoding);
  if (fields == 0) return {};
  const auto value = header[bhttp::field::transfer_encoding];
  // Exactly `chunked`, as nginx takes it: a list parser would stop at junk after a first
  // `chunked` (`chunked ;, gzip`) and read the field as `chunked` alone.
  if (fields == 1 && boost::beast::iequals(common::trim_ows(value), "chunked")) return {};
  return "the upstream's response uses a transfer coding the gateway does not decode "
         "(Transfer-Encoding: " +
         std::string(value) + "); only chunked is supported";
}

namespace {

UpstreamResponse finish(bool keep_alive, bool need_eof, bhttp::response_header<> header,
                        std::string body, bool head, std::size_t buffered) {
  UpstreamResponse out;
  out.reusable = keep_alive && !need_eof && buffered == 0;
  out.keep_alive = keep_alive_timeout(header);
  Response& res = out.response;
  res.base() = std::move(header);
  res.body() = std::move(body);
  res.version(11);
  strip_hop_by_hop(res.base());
  if (!head) {
    if (status_has_body(res.result_int())) {
      res.content_length(res.body().size());
    } else {
      res.erase(bhttp::field::content_length);
    }
  }
  return out;
}

}  // namespace

UpstreamResponse finish_upstream_response(ResponseParser& parser, bhttp::response_header<> header,
                                          bool head, std::size_t buffered) {
  return finish(parser.keep_alive(), parser.need_eof(), std::move(header),
                std::move(parser.get().body()), head, buffered);
}

UpstreamResponse finish_upstream_response(const StreamResponseParser& parser,
                                          bhttp::response_header<> header, std::string body,
                                          bool head, std::size_t buffered) {
  return finish(parser.keep_alive(), parser.need_eof(), std::move(header), std::move(body), head,
                buffered);
}

}  // namespace idemgate::http
