#include "gateway/http/request_rules.hpp"

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/url/parse.hpp>
#include <iterator>

namespace idemgate::http {

namespace bhttp = boost::beast::http;

bool has_obs_fold(std::string_view data) {
  const auto end = data.find("\r\n\r\n");
  const std::string_view section = data.substr(0, end == std::string_view::npos ? end : end + 2);
  for (auto eol = section.find("\r\n"); eol != std::string_view::npos;
       eol = section.find("\r\n", eol + 2)) {
    if (eol + 2 < section.size() && (section[eol + 2] == ' ' || section[eol + 2] == '\t')) {
      return true;
    }
  }
  return false;
}

Rejection obs_fold_rejection() {
  return {Problem::bad_request,
          "a header field line is continued on the next line (obs-fold), which this gateway "
          "refuses (RFC 9112 section 5.2)"};
}

std::optional<Rejection> rejection_for(const boost::system::error_code& ec, const Limits& limits) {
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
    // buffer_overflow: trailers or a chunk-size line that do not fit beside the header limit
    return Rejection{
        Problem::headers_too_large,
        "the header section exceeds " + std::to_string(limits.max_header_bytes) + " bytes"};
  }
  if (ec == bhttp::error::body_limit) {
    return Rejection{
        Problem::payload_too_large,
        "the request body exceeds " + std::to_string(limits.max_request_body) + " bytes"};
  }
  if (ec == bhttp::error::bad_content_length || ec == bhttp::error::multiple_content_length ||
      ec == bhttp::error::bad_transfer_encoding) {
    return Rejection{Problem::bad_framing,
                     "the request framing is ambiguous (RFC 9112 section 6.3): " + ec.message()};
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
      ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    return Rejection{Problem::bad_request, "the request could not be parsed: " + ec.message()};
  }
  return std::nullopt;
}

namespace {

std::optional<Rejection> check_framing(const bhttp::request_header<>& header, bool chunked) {
  const auto te = header.count(bhttp::field::transfer_encoding);
  if (te == 0) return std::nullopt;
  // Beast accepts a Transfer-Encoding whose last coding is not chunked, which leaves the body
  // length undeterminable; RFC 9112 §6.1/§6.3 require 400 and closing for it.
  if (!chunked || header.version() < 11) {
    return Rejection{Problem::bad_framing,
                     "Transfer-Encoding must end with chunked on an HTTP/1.1 request"};
  }
  const bhttp::token_list codings(header[bhttp::field::transfer_encoding]);
  if (te != 1 || std::distance(codings.begin(), codings.end()) != 1) {
    return Rejection{Problem::bad_framing, "only the chunked transfer coding is supported, alone"};
  }
  return std::nullopt;
}

std::optional<Rejection> check_host(const bhttp::request_header<>& header) {
  const auto hosts = header.count(bhttp::field::host);
  if (hosts > 1) return Rejection{Problem::bad_request, "the request has more than one Host field"};
  if (hosts == 0 && header.version() >= 11) {
    return Rejection{Problem::bad_request, "an HTTP/1.1 request must carry a Host field"};
  }
  return std::nullopt;
}

std::optional<Rejection> to_origin_form(bhttp::request_header<>& header) {
  const std::string_view target(header.target().data(), header.target().size());
  if (target.empty() || target.front() == '/' || target == "*") return std::nullopt;
  auto url = boost::urls::parse_absolute_uri(target);
  // Boost.URL 1.81 reads `http://a:b/x` as authority `a:` and path `b/x`; RFC 3986 §3.3 says a
  // path after an authority is empty or starts with '/', so anything else is not a valid URI.
  if (!url || !url->has_authority() || url->encoded_host().empty() ||
      !(url->encoded_path().empty() || url->encoded_path().starts_with('/'))) {
    return Rejection{Problem::bad_request,
                     "the request target is neither origin-form nor a valid absolute URI"};
  }
  std::string origin(url->encoded_path());
  if (origin.empty()) origin = "/";
  if (url->has_query()) origin += "?" + std::string(url->encoded_query());
  header.set(bhttp::field::host, std::string(url->encoded_authority()));
  header.target(origin);
  return std::nullopt;
}

}  // namespace

std::optional<Rejection> check_request_head(bhttp::request_header<>& header, bool chunked) {
  if (auto framing = check_framing(header, chunked)) return framing;
  if (auto host = check_host(header)) return host;
  return to_origin_form(header);
}

}  // namespace idemgate::http
