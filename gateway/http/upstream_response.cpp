#include "gateway/http/upstream_response.hpp"

#include <utility>

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

ResponseHeaderVerdict classify_response_header(unsigned status) {
  if (status < 100) return ResponseHeaderVerdict::bad_status;
  if (status == 101) return ResponseHeaderVerdict::refused;
  if (status >= 200) return ResponseHeaderVerdict::final_response;
  return ResponseHeaderVerdict::interim;  // 1xx interim responses are not forwarded
}

UpstreamResponse finish_upstream_response(ResponseParser& parser, bhttp::response_header<> header,
                                          bool head, std::size_t buffered) {
  UpstreamResponse out;
  out.reusable = parser.keep_alive() && !parser.need_eof() && buffered == 0;
  out.keep_alive = keep_alive_timeout(header);
  Response& res = out.response;
  res.base() = std::move(header);
  res.body() = std::move(parser.get().body());
  res.version(11);
  strip_hop_by_hop(res.base());
  res.erase("Idempotent-Replayed");
  if (!head) {
    if (status_has_body(res.result_int())) {
      res.content_length(res.body().size());
    } else {
      res.erase(bhttp::field::content_length);
    }
  }
  return out;
}

}  // namespace idemgate::http
