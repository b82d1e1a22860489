#pragma once
// Reading a message header from what was read already, and a body after its header: Beast's
// async_read with two guards for chunked bodies that Beast 1.81 lacks. Used for requests
// (session) and upstream responses (upstream pool) alike.

#include <algorithm>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/headers.hpp"

namespace idemgate::http {

/// The fewest unparsed bytes of a chunked body handed to Beast's parser at once: a last chunk
/// with its empty trailer section ("0\r\n\r\n"). Beast 1.81 asserts `n >= 5` when it resumes a
/// last chunk whose trailer section arrived in pieces ("0\r\n", then "\r"): reachable by any
/// peer in a build with assertions on. A chunked body cannot end with fewer bytes still unparsed,
/// so holding them back until more arrive never stalls a complete message.
inline constexpr std::size_t kMinChunkedPut = 5;

/// The chunk-header callback that refuses a chunk-ext outside RFC 9112 §7.1.1
/// (valid_chunk_extensions) with bad_chunk_extension. Stateless and static, so a parser may keep
/// its reference for as long as it lives.
struct ChunkExtensionCheck {
  void operator()(std::uint64_t, std::string_view extensions, boost::system::error_code& ec) const {
    if (!valid_chunk_extensions(extensions)) ec = boost::beast::http::error::bad_chunk_extension;
  }
};
inline ChunkExtensionCheck chunk_extension_check;

/// Installs chunk_extension_check on a freshly constructed parser: Beast allows setting the
/// callback only before the header is parsed.
template <bool isRequest, class Body, class Allocator>
void check_chunk_extensions(boost::beast::http::parser<isRequest, Body, Allocator>& parser) {
  parser.on_chunk_header(chunk_extension_check);
}

/// Parses the header that `buffer` holds into `parser`, consuming its bytes: success once the
/// header is parsed, the parser's error (bad_method, header_limit, ...), or nullopt when the
/// header is not whole in `buffer` yet (nothing consumed). As Beast's read_header without the
/// read: a header that arrived whole costs no asynchronous operation.
template <bool isRequest, class Body, class Allocator>
std::optional<boost::system::error_code> put_header(
    boost::beast::flat_buffer& buffer,
    boost::beast::http::parser<isRequest, Body, Allocator>& parser) {
  if (parser.is_header_done()) return boost::system::error_code{};
  if (buffer.size() == 0) return std::nullopt;
  boost::system::error_code ec;
  buffer.consume(parser.put(buffer.data(), ec));
  if (ec == boost::beast::http::error::need_more) return std::nullopt;
  if (ec) return ec;
  if (parser.is_header_done()) return ec;
  return std::nullopt;
}

/// Whether `buffer` holds an LF not preceded by a CR. Asked when a chunked body's parser needs
/// more than the bytes left in it: they begin a chunk-size line or the trailer section, whose
/// lines end in CRLF (RFC 9112 §7.1). Beast 1.81 reads a bare LF as an ordinary byte and would
/// wait, for ever or up to the buffer's limit, for a CRLF a peer that ends its lines with LF never
/// sends; such a line is refused at once instead (a recipient may refuse it, RFC 9112 §2.2).
inline bool has_bare_lf(const boost::beast::flat_buffer& buffer) {
  const auto bytes = buffer.data();
  const std::string_view text(static_cast<const char*>(bytes.data()), bytes.size());
  for (auto lf = text.find('\n'); lf != std::string_view::npos; lf = text.find('\n', lf + 1)) {
    if (lf == 0 || text[lf - 1] != '\r') return true;
  }
  return false;
}

/// The part of async_read_body that needs no I/O: hands `parser` what `buffer` holds (never fewer
/// than kMinChunkedPut bytes of a chunked body). Returns how the read ends when it ends here (the
/// message done, a buffer_body piece filled, the parser's error), nullopt when more bytes must be
/// read. `room`: a buffer_body's free bytes when the read began.
template <bool isRequest, class Body, class Allocator>
std::optional<boost::system::error_code> put_buffered(
    boost::beast::flat_buffer& buffer,
    boost::beast::http::parser<isRequest, Body, Allocator>& parser, std::size_t room) {
  namespace bhttp = boost::beast::http;
  using boost::system::error_code;
  constexpr bool kPiece = std::is_same_v<Body, bhttp::buffer_body>;
  for (;;) {
    if (parser.is_done()) return error_code{};
    if (buffer.size() == 0 || (parser.chunked() && buffer.size() < kMinChunkedPut)) {
      return std::nullopt;
    }
    error_code ec;
    const std::size_t used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if constexpr (kPiece) {
      if (ec == bhttp::error::need_buffer) return error_code{};  // the piece is full
    }
    if (ec && ec != bhttp::error::need_more) return ec;
    if (parser.is_done()) return error_code{};
    if constexpr (kPiece) {
      if (parser.get().body().size < room) return error_code{};
    }
    // Bytes the parser could not take are an incomplete chunk-size line or trailer section.
    if (ec == bhttp::error::need_more && parser.chunked() && has_bare_lf(buffer))
      return bhttp::error::bad_chunk;
    if (ec || used == 0) return std::nullopt;
  }
}

/// Reads the rest of the message whose header `parser` has already parsed, from `stream` through
/// `buffer` (as beast::http::async_read; the buffer's max_size bounds a chunk-size line or trailer
/// section), never handing the parser fewer than kMinChunkedPut bytes of a chunked body. Errors
/// come back as values: the parser's own (body_limit, bad_chunk, bad_chunk_extension from
/// check_chunk_extensions, ...), buffer_overflow when a line does not fit the buffer,
/// partial_message when the peer closes first, or the stream's error (timeout, reset).
///
/// With a buffer_body parser it reads one piece instead: it returns as soon as body bytes are in
/// the body's buffer (body().size has shrunk) or the buffer is full, for relaying (SPEC C38).
///
/// `per_read` (optional): each read from the stream must complete within it (the expiry of the
/// stream's lowest layer is set before every read), so a peer that keeps sending is never cut by
/// a total (SPEC C07, C38); without it, the caller's expiry covers the whole body.
template <class Stream, bool isRequest, class Body, class Allocator>
boost::asio::awaitable<boost::system::error_code> async_read_body(
    Stream& stream, boost::beast::flat_buffer& buffer,
    boost::beast::http::parser<isRequest, Body, Allocator>& parser,
    std::optional<std::chrono::steady_clock::duration> per_read = std::nullopt) {
  namespace bhttp = boost::beast::http;
  using boost::system::error_code;
  constexpr std::size_t kReadSize = 64 * 1024;

  std::size_t room = 0;  // buffer_body: the body buffer's free bytes when called
  if constexpr (std::is_same_v<Body, bhttp::buffer_body>) room = parser.get().body().size;
  parser.eager(true);
  for (;;) {
    if (auto ended = put_buffered(buffer, parser, room)) co_return *ended;
    const std::size_t free = std::min(kReadSize, buffer.max_size() - buffer.size());
    if (free == 0) co_return bhttp::error::buffer_overflow;
    if (per_read) boost::beast::get_lowest_layer(stream).expires_after(*per_read);
    auto [rec, n] = co_await stream.async_read_some(buffer.prepare(free), common::use_nothrow);
    buffer.commit(n);
    if (rec == boost::asio::error::eof) {
      // The end of a body delimited by the connection's close (RFC 9112 §6.3 item 8), or a
      // message cut short: put_eof tells which.
      error_code eec;
      parser.put_eof(eec);
      co_return eec;
    }
    if (rec) co_return rec;
  }
}

}  // namespace idemgate::http
