#include "gateway/http/relay.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffer_traits.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "gateway/common/deadline_list.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/upstream_response.hpp"

namespace idemgate::http {

using common::use_nothrow;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

/// How reading an upstream's response header ended (SPEC C03, C05, C08).
struct ResponseHead {
  boost::system::error_code error;  ///< the read failed: a timeout, EOF, reset, a parse error
  bool got_bytes = false;  ///< response bytes had arrived: no stale pooled connection (C08)
  std::string refused;     ///< why a header is no answer: a status under 100, an unasked 101
};

/// Why an exchange got no response, from how reading its header ended (SPEC C05, C08).
struct NoResponse {
  bool timed_out = false;  ///< no response header within request_timeout (→ 504)
  bool stale = false;      ///< closed before any response byte: a retryable request may go again
  std::string detail;      ///< what failed, for the problem's detail; empty when there is a header
};

/// Classifies `got` for relay() and relay_held(): a timeout (of the read, of the write, or
/// `timed_out` by the caller's deadline) is timed_out; a close or reset before any response
/// byte is stale; a write failure before any response byte is named as such. Pure.
NoResponse no_response(const ResponseHead& got, const boost::system::error_code& write_error,
                       bool timed_out) {
  NoResponse out;
  if (!got.error) {
    out.detail = got.refused;
    return out;
  }
  out.timed_out =
      timed_out || got.error == beast::error::timeout || write_error == beast::error::timeout;
  out.stale = !got.got_bytes && !out.timed_out && closed_before_answer(got.error);
  if (out.timed_out) {
    out.detail = "gave no response header within request_timeout";
  } else if (write_error && !got.got_bytes) {
    out.detail = "writing the request failed: " + write_error.message();
  } else {
    out.detail = "reading the response header failed: " + got.error.message();
  }
  return out;
}

/// The most a read of a response header asks for (Beast's own read size).
constexpr std::size_t kResponseReadSize = 64 * 1024;

// A status line without the SP after its code ("HTTP/1.1 200\r\n", which some small servers
// send when they have no reason phrase) gets that SP, which Beast requires: nginx, curl and Go
// read such a line as status 200, and so does the gateway. `buffer` starts at a response.
// Returns false while the first line may still be of that form and has not all arrived.
bool mend_status_line(beast::flat_buffer& buffer) {
  constexpr std::size_t kCodeEnd = 12;  // "HTTP/1.1 200"
  const auto* p = static_cast<const char*>(buffer.data().data());
  const std::size_t n = buffer.size();
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  const std::string_view shape = "HTTP/d.d ddd";
  for (std::size_t i = 0; i < std::min(n, kCodeEnd); ++i) {
    if (shape[i] == 'd' ? !digit(p[i]) : p[i] != shape[i]) return true;  // not a short line
  }
  if (n <= kCodeEnd) return false;
  if (p[kCodeEnd] != '\r' || n == buffer.max_size()) return true;
  buffer.prepare(1);  // may move the bytes
  buffer.commit(1);
  auto* q = static_cast<char*>(buffer.data().data());
  std::memmove(q + kCodeEnd + 1, q + kCodeEnd, buffer.size() - kCodeEnd - 1);
  q[kCodeEnd] = ' ';
  return true;
}

/// Reads response headers from `stream`, each into a fresh `parser` (prepare_response_parser),
/// dropping 1xx interim responses, until a final response, or a `101` when `upgrade` (SPEC C40).
/// The stream's expiry is the caller's. `buffer` keeps what was read past the header.
asio::awaitable<ResponseHead> read_response_head(ByteStream stream, beast::flat_buffer& buffer,
                                                 std::unique_ptr<StreamResponseParser>& parser,
                                                 bool head, bool upgrade) {
  ResponseHead out;
  for (;;) {
    parser = std::make_unique<StreamResponseParser>();
    prepare_response_parser(*parser, head);
    // As Beast's async_read_header, one read_some at a time on the stream itself: no composed
    // operation, and no read when the header came with the last one.
    boost::system::error_code ec;
    bool line_mended = false;
    for (;;) {
      if (!line_mended) line_mended = mend_status_line(buffer);
      if (const auto parsed = put_header(buffer, *parser)) {
        ec = *parsed;
        break;
      }
      const std::size_t room = beast::read_size(buffer, kResponseReadSize);
      if (room == 0) {
        ec = bhttp::error::buffer_overflow;
        break;
      }
      auto [rec, n] = co_await stream.async_read_some(buffer.prepare(room), use_nothrow);
      buffer.commit(n);
      if (rec == asio::error::eof) {
        // Closed inside a header, or before one began (Beast's two answers).
        if (parser->got_some()) {
          parser->put_eof(ec);
        } else {
          ec = bhttp::error::end_of_stream;
        }
        break;
      }
      if (rec) {
        ec = rec;
        break;
      }
    }
    if (ec) {
      out.got_bytes = out.got_bytes || parser->got_some() || buffer.size() > 0;
      out.error = ec;
      co_return out;
    }
    out.got_bytes = true;
    const unsigned status = parser->get().result_int();
    if (status == 101 && upgrade) co_return out;
    const auto verdict = classify_response_header(status);
    if (verdict == ResponseHeaderVerdict::refused) {
      out.refused = "the upstream switched protocols without being asked to";
      co_return out;
    }
    if (verdict == ResponseHeaderVerdict::bad_status) {
      out.refused = "the upstream sent status " + std::to_string(status) + ", under 100";
      co_return out;
    }
    if (verdict == ResponseHeaderVerdict::final_response) {
      if (!head && status_has_body(status))
        out.refused = unsupported_transfer_coding(parser->get().base());
      co_return out;
    }
  }
}

/// One piece of a body into [`data`, `data + size`) (async_read_body with a buffer_body parser):
/// on return body().size is what is left of `size`. `timeout` bounds each read (progress).
template <bool isRequest>
asio::awaitable<error_code> read_body_piece(ByteStream stream, beast::flat_buffer& buffer,
                                            bhttp::parser<isRequest, bhttp::buffer_body>& parser,
                                            char* data, std::size_t size, Duration timeout) {
  parser.get().body().data = data;
  parser.get().body().size = size;
  co_return co_await async_read_body(stream, buffer, parser,
                                     std::chrono::duration_cast<Clock::duration>(timeout));
}

/// Writes what the serializer has (the header first, then the body piece the parser left in the
/// body), within `timeout` per write. need_buffer (more body to come) is success.
template <bool isRequest>
asio::awaitable<error_code> write_piece(ByteStream stream,
                                        bhttp::serializer<isRequest, bhttp::buffer_body>& sr,
                                        Duration timeout) {
  stream.tcp().expires_after(timeout);
  auto [ec, n] = co_await bhttp::async_write(stream, sr, use_nothrow);
  if (ec == bhttp::error::need_buffer) ec = {};
  co_return ec;
}

/// Points a body that the parser filled (its size now what is left) at the bytes read, for the
/// serializer: [data, data + filled), `more` unless the message is done.
template <class Message>
void to_write(Message& message, char* data, std::size_t capacity, bool done) {
  auto& body = message.body();
  body.size = capacity - body.size;
  body.data = body.size == 0 ? nullptr : data;
  body.more = !done;
}

/// Stream buffers of one io thread, reused from exchange to exchange: allocating (and zeroing)
/// two fresh `stream_buffer`s per request cost a memset and page faults that were a quarter of
/// a pass-through request's CPU. At most kMaxFreeBuffers stay parked per thread.
class StreamBuffer {
 public:
  explicit StreamBuffer(std::size_t size) : size_(size) {
    auto& pool = free_list();
    if (pool.size != size) {  // first use, or a reload changed stream_buffer
      pool.buffers.clear();
      pool.size = size;
    }
    if (pool.buffers.empty()) {
      data_.reset(new char[size]);  // uninitialised: only bytes read into it are used
    } else {
      data_ = std::move(pool.buffers.back());
      pool.buffers.pop_back();
    }
  }
  ~StreamBuffer() {
    auto& pool = free_list();
    if (pool.size == size_ && pool.buffers.size() < kMaxFreeBuffers) {
      pool.buffers.push_back(std::move(data_));
    }
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  char* data() { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::size_t kMaxFreeBuffers = 64;
  struct FreeList {
    std::size_t size = 0;
    std::vector<std::unique_ptr<char[]>> buffers;
  };
  static FreeList& free_list() {
    thread_local FreeList pool;
    return pool;
  }

  std::size_t size_;
  std::unique_ptr<char[]> data_;
};

struct TunnelState {
  explicit TunnelState(asio::any_io_executor executor) : timer(std::move(executor)) {}
  asio::steady_timer timer;
  Clock::time_point last = Clock::now();
  bool done = false;
  bool idle = false;
  std::string ended_by;
};

asio::awaitable<void> pump(ByteStream from, ByteStream to, StreamBuffer& buffer, TunnelState& state,
                           std::uint64_t& moved, const char* side, Duration write_timeout) {
  for (;;) {
    from.tcp().expires_never();
    auto [ec, n] =
        co_await from.async_read_some(asio::buffer(buffer.data(), buffer.size()), use_nothrow);
    if (ec) {
      if (state.ended_by.empty()) {
        state.ended_by = std::string(side) + (ec == asio::error::eof ? " closed" : " failed: ") +
                         (ec == asio::error::eof ? "" : ec.message());
      }
      break;
    }
    state.last = Clock::now();
    to.tcp().expires_after(write_timeout);
    auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buffer.data(), n), use_nothrow);
    if (wec) {
      if (state.ended_by.empty()) state.ended_by = "writing failed: " + wec.message();
      break;
    }
    moved += wn;
    state.last = Clock::now();
  }
  state.done = true;
  state.timer.cancel();
  from.tcp().close();
  to.tcp().close();
}

asio::awaitable<void> watchdog(TunnelState& state, Duration idle, ByteStream a, ByteStream b) {
  while (!state.done) {
    state.timer.expires_at(state.last + std::chrono::duration_cast<Clock::duration>(idle));
    co_await state.timer.async_wait(use_nothrow);
    if (state.done) break;
    if (Clock::now() - state.last >= idle) {
      state.idle = true;
      if (state.ended_by.empty()) state.ended_by = "tunnel_idle_timeout";
      a.tcp().close();
      b.tcp().close();
      break;
    }
  }
}

/// Sends the bytes that arrived behind a header to the other side before the tunnel starts.
asio::awaitable<error_code> flush_leftover(beast::flat_buffer& buffer, ByteStream to,
                                           Duration timeout, std::uint64_t& moved) {
  if (buffer.size() == 0) co_return error_code{};
  to.tcp().expires_after(timeout);
  auto [ec, n] = co_await asio::async_write(to, buffer.data(), use_nothrow);
  buffer.consume(n);
  moved += n;
  co_return ec;
}

/// The first reason an exchange was cut wins: what follows it (a read aborted by the close) only
/// echoes it.
void note_cut(RelayOutcome& out, std::string reason) {
  if (out.cut.empty()) out.cut = std::move(reason);
}

/// A response header for the client, framed for a body streamed from the upstream (C03): the
/// upstream's Content-Length when it has one (for HEAD, what a GET would return), none for a
/// status without body, otherwise chunked to HTTP/1.1 and delimited by the connection's close to
/// HTTP/1.0. Returns whether the connection may carry the next request.
bool frame_streamed(bhttp::response<bhttp::buffer_body>& res, const StreamResponseParser& from,
                    bool head, bool keep_alive) {
  if (!status_has_body(res.result_int())) {
    res.erase(bhttp::field::content_length);
  } else if (const auto length = from.content_length(); length || head) {
    if (length) set_content_length(res.base(), *length);
  } else if (res.version() >= 11) {
    res.chunked(true);
  } else {
    keep_alive = false;  // HTTP/1.0: the body ends with the connection (C03)
  }
  set_keep_alive(res, keep_alive);
  return keep_alive;
}

/// The length of a response body that the header's read already brought whole into `buffer`:
/// 0 when the message has none (HEAD, 1xx/204/304, Content-Length: 0), its Content-Length when
/// `buffer` holds that much; nullopt when more is to be read or the body is chunked or delimited
/// by the connection's close.
std::optional<std::size_t> whole_body_read(const StreamResponseParser& parser,
                                           const beast::flat_buffer& buffer, bool head) {
  if (parser.is_done() || head) return 0;
  const auto length = parser.content_length();
  if (!length || parser.chunked() || *length > buffer.size()) return std::nullopt;
  return static_cast<std::size_t>(*length);
}

/// Writes a response head and `body`: the head that render_head put into scratch[0, head_size)
/// goes with the body in one write; what the socket does not take at once follows piece by
/// piece, each within `timeout`. A head_size of 0 (a head that did not fit) has the serializer
/// write `header` first.
asio::awaitable<error_code> write_whole(ByteStream client, const bhttp::response_header<>& header,
                                        std::size_t head_size, asio::const_buffer body,
                                        StreamBuffer& scratch, Duration timeout) {
  if (head_size == 0) {
    client.tcp().expires_after(timeout);
    bhttp::response<bhttp::empty_body> head_only{header};
    bhttp::response_serializer<bhttp::empty_body> sr{head_only};
    auto [ec, n] = co_await bhttp::async_write_header(client, sr, use_nothrow);
    if (ec) co_return ec;
  }
  const std::array<asio::const_buffer, 2> message{asio::buffer(scratch.data(), head_size), body};
  error_code ec;
  const std::size_t sent = client.write_now(message, ec);
  if (ec) co_return ec;
  beast::buffers_suffix<std::array<asio::const_buffer, 2>> rest(message);
  rest.consume(sent);
  while (beast::buffer_bytes(rest) > 0) {
    client.tcp().expires_after(timeout);
    auto [wec, n] = co_await client.async_write_some(rest, use_nothrow);
    if (wec) co_return wec;
    rest.consume(n);
  }
  co_return error_code{};
}

/// Writes the header `rs` serializes, then `prefix` (body bytes read already), then the rest of
/// the body from `up` as it arrives, one `down` buffer at a time (C38, C39). Each client write
/// must progress within `client_idle`, each upstream read within `up_idle`. On failure, `cut`
/// says why.
asio::awaitable<error_code> pass_body(ByteStream up, beast::flat_buffer& ubuf,
                                      StreamResponseParser& rparser,
                                      bhttp::response_serializer<bhttp::buffer_body>& rs,
                                      ByteStream client, std::string& prefix, StreamBuffer& down,
                                      Duration up_idle, Duration client_idle,
                                      std::string_view upstream_name, RelayOutcome& out) {
  auto& body = rparser.get().body();
  body.data = prefix.empty() ? nullptr : prefix.data();
  body.size = prefix.size();
  body.more = !rparser.is_done();
  // The header goes out first (C38), and before any more of the body is parsed: the parser adds
  // a chunked body's trailer fields to the fields the serializer renders, and trailers are
  // dropped (C03). Without body bytes to send the serializer would defer the header.
  error_code ec;
  if (prefix.empty()) {
    client.tcp().expires_after(client_idle);
    std::tie(ec, std::ignore) = co_await bhttp::async_write_header(client, rs, use_nothrow);
  } else {
    ec = co_await write_piece(client, rs, client_idle);
  }
  while (!ec && !rs.is_done()) {
    if (const auto rec =
            co_await read_body_piece(up, ubuf, rparser, down.data(), down.size(), up_idle)) {
      note_cut(out, "upstream " + std::string(upstream_name) +
                        ": reading the response body failed: " + rec.message());
      co_return rec;
    }
    to_write(rparser.get(), down.data(), down.size(), rparser.is_done());
    ec = co_await write_piece(client, rs, client_idle);
  }
  if (ec) note_cut(out, "writing the response failed: " + ec.message());
  co_return ec;
}

/// How long an exchange runs, from the request's end, before the client's connection is watched
/// (C48 allows 1 s for the close). A quick exchange ends without that read, which on a quiet
/// connection would be one more recv per request that finds nothing.
constexpr auto kWatchAfter = std::chrono::milliseconds(200);

/// What the tasks of one attempt share: the request goes up while the response comes down
/// (C47), and the client's connection is watched once nothing else reads it (C48).
struct Duplex {
  explicit Duplex(ByteStream upstream) : up(upstream) {}
  ByteStream up;
  beast::flat_buffer ubuf{2 * kMaxResponseHeaderBytes};
  std::unique_ptr<StreamResponseParser> rparser;
  /// The upload's: from the request's end, kWatchAfter, then request_timeout for the header.
  /// A held exchange's: the end of its client watch. Made only where it is waited on.
  std::unique_ptr<asio::steady_timer> deadline;
  bool uploaded = false;       ///< the upload task is past the request (sent, or failed)
  bool answered = false;       ///< the response header arrived, or reading it failed
  bool ended = false;          ///< the download task ended: the others stop
  bool timed_out = false;      ///< no response header within request_timeout
  bool client_failed = false;  ///< reading the client's body failed: the upstream is cut
  bool watching = false;       ///< the exchange outlasted kWatchAfter: the client is watched
  error_code write_error;      ///< writing to the upstream failed
  /// relay_held(): when the whole answer must have arrived (max: request_timeout from its
  /// header on).
  Clock::time_point answer_by = Clock::time_point::max();
};

/// Where relay_held() reads an answer: the whole response, or its header and the body bytes
/// read before the body passed the hold limit when the rest is passed on (C39).
struct HeldAnswer {
  std::size_t hold_limit = 0;
  /// The attempt's connection, shared with a writer that may still be sending the request
  /// (C47) and, for a passed-on body, with the ResponseTail.
  std::shared_ptr<UpstreamPool::Wire> wire;
  Response response;   ///< end-to-end fields only; no Content-Length when `pass_on`
  std::string prefix;  ///< `pass_on`: the body bytes read already
  bool pass_on = false;
  bool reusable = false;  ///< the connection may go back to the pool
  std::optional<std::chrono::seconds> keep_alive;
};

/// One exchange with the upstream, its request and what its attempts found: relay()'s (the
/// client's connection and parser set) or relay_held()'s (`hold` set).
struct RelayState {
  RelayState(RelayOutcome& outcome, const Upstream& to) : out(outcome), upstream(to) {}
  RelayRequest* in = nullptr;             ///< relay(): the client
  StreamRequestParser* parser = nullptr;  ///< relay(): the client's request, its body to come
  StreamBuffer* up_buffer = nullptr;      ///< relay(): client → upstream; a held body first
  HeldAnswer* hold = nullptr;             ///< relay_held(): where the answer goes
  RelayOutcome& out;
  const Upstream& upstream;
  bool head = false;             ///< a HEAD request: the response has no body
  bool websocket = false;        ///< a 101 to it opens a tunnel (C40)
  std::size_t held = 0;          ///< a retryable request's body, read whole into up_buffer
  bool retryable = true;         ///< the request may go out again on a fresh connection (C08)
  bool added_as_fields = false;  ///< relay(): the session's added lines are fields (add_as_fields)
  common::HostPort server;       ///< the upstream server of the current attempt
  std::string failure;           ///< why there is no response (→ 502/504)
  bool stale = false;  ///< closed before answering: a retryable request may go again (C08)
  bool timed_out = false;
  bool tunnel = false;    ///< a 101 to a WebSocket request arrived: the tunnel follows
  bool reusable = false;  ///< the upstream connection may go back to the pool
  std::optional<std::chrono::seconds> upstream_keep_alive;
};

/// The download ended: stop the header deadline and any client read (the upload's or the
/// watch's; nothing writes to the client any more).
void end_exchange(RelayState& x, Duplex& d) {
  d.ended = true;
  if (d.deadline) d.deadline->cancel();
  if (x.in) x.in->client.tcp().cancel();
}

/// Once the request is out and the exchange has lasted kWatchAfter, a read on the client's
/// connection (which nothing else reads then) notices a close or a reset while the client waits
/// for the response or while it streams (C48): the upstream connection is closed at once. Bytes
/// that arrive instead (the next pipelined request) stay in the client's buffer for the session.
asio::awaitable<void> watch(RelayState& x, Duplex& d) {
  constexpr std::size_t kWatchRead = 4096;
  auto& buffer = *x.in->client_buffer;
  if (d.ended || d.client_failed || buffer.size() > 0) co_return;
  const std::size_t room = std::min(kWatchRead, buffer.max_size() - buffer.size());
  if (room == 0) co_return;
  x.in->client.tcp().expires_never();
  auto [ec, n] = co_await x.in->client.async_read_some(buffer.prepare(room), use_nothrow);
  buffer.commit(n);
  if (!ec || d.ended) co_return;
  x.out.client_closed = true;
  note_cut(x.out, ec == asio::error::eof ? "the client closed the connection"
                                         : "the client connection failed: " + ec.message());
  d.up.tcp().close();
  x.in->client.tcp().close();
}

/// Waits for the response header until `head_by`: past it, the exchange times out (the upstream
/// connection closes, the download reports it). Ends early when the header or the end comes.
asio::awaitable<void> header_deadline(Duplex& d, Clock::time_point head_by) {
  while (!d.ended && !d.answered) {
    d.deadline->expires_at(head_by);
    co_await d.deadline->async_wait(use_nothrow);
    if (!d.ended && !d.answered && Clock::now() >= head_by) {
      d.timed_out = true;
      d.up.tcp().close();
    }
  }
}

/// The request whose body is held whole in up_buffer[0, held) (C08) as one write: its head
/// rendered behind the body in the same buffer; nullopt when the head does not fit there.
std::optional<std::array<asio::const_buffer, 2>> held_request(RelayState& x) {
  const std::string_view added =
      x.in->added && !x.added_as_fields ? x.in->added->lines() : std::string_view{};
  const std::size_t head_size = render_head(x.parser->get(), x.up_buffer->data() + x.held,
                                            x.up_buffer->size() - x.held, added);
  if (head_size == 0) return std::nullopt;
  return std::array<asio::const_buffer, 2>{asio::buffer(x.up_buffer->data() + x.held, head_size),
                                           asio::buffer(x.up_buffer->data(), x.held)};
}

/// The session's added lines (RelayRequest::added) as fields of the request, once: for a head
/// that Beast's serializer writes.
void add_as_fields(RelayState& x) {
  if (!x.in->added || x.added_as_fields) return;
  x.in->added->insert_into(x.parser->get());
  x.added_as_fields = true;
}

/// Writes a request whose body is held whole when held_request() found no room for its head:
/// through Beast's serializer.
asio::awaitable<error_code> send_serialized(RelayState& x, Duplex& d) {
  add_as_fields(x);
  auto& req = x.parser->get();
  req.body().data = x.held == 0 ? nullptr : x.up_buffer->data();
  req.body().size = x.held;
  req.body().more = false;
  bhttp::request_serializer<bhttp::buffer_body> sr{req};
  auto [ec, n] = co_await bhttp::async_write(d.up, sr, use_nothrow);
  co_return ec;
}

/// A request whose body is streamed (C38): the header, then the body as it arrives; then, once
/// it is all out, the request_timeout for the response header. (A held body goes out in
/// held_exchange.)
asio::awaitable<void> upload(RelayState& x, Duplex& d) {
  auto& in = *x.in;
  const Limits& limits = *in.limits;
  auto& req = x.parser->get();
  error_code wec;
  d.deadline = std::make_unique<asio::steady_timer>(in.client.get_executor());
  add_as_fields(x);
  bhttp::request_serializer<bhttp::buffer_body> sr{req};
  d.up.tcp().expires_after(x.upstream.idle_timeout);
  auto [ec, n] = co_await bhttp::async_write_header(d.up, sr, use_nothrow);
  wec = ec;
  while (!wec && !sr.is_done() && !d.ended) {
    const auto rec =
        co_await read_body_piece(in.client, *in.client_buffer, *x.parser, x.up_buffer->data(),
                                 x.up_buffer->size(), limits.idle_timeout);
    if (d.ended) break;  // answered in full: the rest of the body is not read (C47)
    if (rec) {
      // The client failed, stalled, left or passed max_streamed_body: the upstream has a
      // partial request, so both connections end (C38, C48).
      x.out.request_error = rec;
      x.out.client_closed = closed_before_answer(rec) || rec == bhttp::error::partial_message;
      note_cut(x.out, rec == bhttp::error::body_limit
                          ? "the request body exceeds max_streamed_body (" +
                                std::to_string(limits.max_streamed_body) + " bytes)"
                          : "reading the request body failed: " + rec.message());
      d.client_failed = true;
      d.uploaded = true;
      d.up.tcp().close();
      co_return;
    }
    to_write(req, x.up_buffer->data(), x.up_buffer->size(), x.parser->is_done());
    wec = co_await write_piece(d.up, sr, x.upstream.idle_timeout);
  }
  // A failed write ends nothing by itself: the upstream may have answered before it stopped
  // reading (C47), and the download finds out.
  d.write_error = wec;
  d.uploaded = true;
  // One timer: until the client's watch starts, and until when the header may take. A quick
  // exchange ends before kWatchAfter, with no watch started.
  const auto now = Clock::now();
  const auto watch_at = now + kWatchAfter;
  const auto head_by =
      now + std::chrono::duration_cast<Clock::duration>(x.upstream.request_timeout);
  while (!d.ended && Clock::now() < watch_at) {
    d.deadline->expires_at(d.answered ? watch_at : std::min(watch_at, head_by));
    co_await d.deadline->async_wait(use_nothrow);
    if (!d.ended && !d.answered && Clock::now() >= head_by) {
      d.timed_out = true;
      d.up.tcp().close();
      co_return;
    }
  }
  if (d.ended) co_return;
  d.watching = true;
  if (d.answered) {
    co_await watch(x, d);
  } else {
    using namespace asio::experimental::awaitable_operators;
    co_await (header_deadline(d, head_by) && watch(x, d));
  }
}

/// Adds to the response header what the gateway adds to every answer: a fresh `Date`, `Via`
/// and the request's id (C02, C32). With `out`, the head is rendered into it with those fields
/// as lines after the upstream's (no field element for them) and its size returned; without,
/// or when it does not fit, they become fields and 0 is returned. A plain function: the lines
/// stay out of respond()'s coroutine frame.
std::size_t finish_head(const RelayRequest& in, bhttp::response_header<>& header,
                        StreamBuffer* out) {
  AddedFields added;
  add_answer_fields(header, in.request_id_header, in.request_id, added);
  const std::size_t size = out ? render_head(header, out->data(), out->size(), added.lines()) : 0;
  if (size == 0) added.insert_into(header);
  return size;
}

/// The response header arrived: relay it and its body to the client (C38).
asio::awaitable<void> respond(RelayState& x, Duplex& d) {
  auto& in = *x.in;
  auto& out = x.out;
  const Limits& limits = *in.limits;
  StreamResponseParser& rparser = *d.rparser;
  auto& res = rparser.get();
  out.status = res.result_int();
  out.outcome = "passthrough";
  x.upstream_keep_alive = keep_alive_timeout(res.base());
  const bool upstream_reusable = rparser.keep_alive();
  const bool delimited =
      rparser.content_length() || rparser.chunked() || !status_has_body(out.status) || in.head;

  // The header as the client gets it.
  strip_hop_by_hop(res.base());
  in.handler->strip_owned_fields(res.base());
  if (in.route) in.handler->add_route_fields(*in.route, in.origin, res.base());
  res.version(in.client_version);
  // An answer that comes before the request body has all arrived closes the connection after
  // it: the rest of the body may never be read (C47).
  out.keep_alive =
      frame_streamed(res, rparser, in.head, in.client_keep_alive && x.parser->is_done());

  StreamBuffer down(limits.stream_buffer);
  error_code ec;
  const auto whole = whole_body_read(rparser, d.ubuf, in.head);
  const std::size_t head_size = finish_head(in, res.base(), whole ? &down : nullptr);
  if (whole) {
    // The usual answer: its body (if any) came with the header. The head is rendered and goes
    // out with the body in one write.
    ec =
        co_await write_whole(in.client, res.base(), head_size,
                             asio::buffer(d.ubuf.data().data(), *whole), down, limits.idle_timeout);
    d.ubuf.consume(*whole);
    if (ec) note_cut(out, "writing the response failed: " + ec.message());
  } else {
    bhttp::response_serializer<bhttp::buffer_body> rs{res};
    std::string no_prefix;
    ec = co_await pass_body(d.up, d.ubuf, rparser, rs, in.client, no_prefix, down,
                            x.upstream.idle_timeout, limits.idle_timeout, x.upstream.name, out);
  }
  if (ec) {
    out.keep_alive = false;
    in.client.tcp().close();
    co_return;  // the lease goes: the upstream connection closes with it
  }
  out.written = true;
  x.reusable = upstream_reusable && delimited && d.ubuf.size() == 0 && d.uploaded && !d.write_error;
  if (!d.uploaded) d.up.tcp().close();  // answered before the whole request went out (C47)
}

/// The response header arrived for relay_held(): the body is read into the answer up to its
/// hold limit (C39) and the upstream's max_response_body, all of it by `d.answer_by` (C05).
asio::awaitable<void> hold_answer(RelayState& x, Duplex& d) {
  HeldAnswer& answer = *x.hold;
  StreamResponseParser& parser = *d.rparser;
  const auto fail = [&](const error_code& ec, std::string_view detail) {
    x.timed_out = ec == beast::error::timeout;
    x.failure = upstream_where(x.upstream, x.server) +
                (x.timed_out ? " gave no complete response within request_timeout"
                             : ": " + std::string(detail));
  };
  // Trailer fields of a chunked body are merged into the fields by the parser: its header is
  // kept as it came. Any other header is taken from the parser once the body is read.
  std::optional<bhttp::response_header<>> kept;
  if (!parser.is_done() && parser.chunked()) kept.emplace(parser.get().base());
  const auto length = parser.content_length();
  std::string body;
  std::size_t filled = 0;
  bool pass_on = !parser.is_done() && length && *length > answer.hold_limit;  // C39
  constexpr std::string_view kTooLarge = "the response body is larger than max_response_body";
  if (!pass_on && length && !parser.is_done()) {
    if (*length > x.upstream.max_response_body) {
      fail({}, kTooLarge);
      co_return;
    }
    body.resize(static_cast<std::size_t>(*length));
  }
  // The usual answer's body came with its header: no read, no expiry to set.
  const bool read_more = !pass_on && !parser.is_done();
  if (read_more && d.answer_by == Clock::time_point::max()) {
    d.answer_by =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(x.upstream.request_timeout);
  }
  if (read_more) d.up.tcp().expires_at(d.answer_by);
  while (!pass_on && !parser.is_done()) {
    constexpr std::size_t kPiece = 64 * 1024;
    if (!length && body.size() - filled < kPiece)
      body.resize(std::max(2 * body.size(), filled + kPiece));
    const std::size_t room = body.size() - filled;
    parser.get().body().data = body.data() + filled;
    parser.get().body().size = room;
    const auto ec = co_await async_read_body(d.up, d.ubuf, parser);
    filled += room - parser.get().body().size;
    if (ec) {
      fail(ec, "reading the response body failed: " + ec.message());
      co_return;
    }
    if (!parser.is_done() && filled > answer.hold_limit) {
      pass_on = true;  // C39: the held part of a chunked body passed the limit
    } else if (filled > x.upstream.max_response_body) {
      fail({}, kTooLarge);
      co_return;
    }
  }
  if (read_more) d.up.tcp().expires_never();
  body.resize(filled);
  answer.keep_alive = keep_alive_timeout(kept ? *kept : parser.get().base());
  answer.pass_on = pass_on;
  if (pass_on) {
    // The tail reads the rest through the parser, which keeps its header (ResponseTail::finish
    // reads its Keep-Alive).
    auto finished = finish_upstream_response(parser, kept ? std::move(*kept) : parser.get().base(),
                                             {}, x.head, 0);
    finished.response.erase(bhttp::field::content_length);
    answer.response = std::move(finished.response);
    answer.prefix = std::move(body);
    co_return;
  }
  auto finished =
      finish_upstream_response(parser, kept ? std::move(*kept) : std::move(parser.get().base()),
                               std::move(body), x.head, d.ubuf.size());
  answer.response = std::move(finished.response);
  // A complete answer before the whole request went out (C47): the connection carries nothing
  // more, and the write still waiting on it ends.
  const UpstreamPool::Wire& wire = *answer.wire;
  answer.reusable = finished.reusable && !wire.writing && !wire.write_error;
  if (wire.writing) d.up.tcp().close();
}

/// The response: its header (interim ones dropped; a 101 only to a WebSocket request, C40),
/// then the response itself, or why there is none.
asio::awaitable<void> download(RelayState& x, Duplex& d) {
  d.up.tcp().expires_never();  // the upload sets the header's deadline once the request is out
  const ResponseHead got =
      co_await read_response_head(d.up, d.ubuf, d.rparser, x.head, x.websocket);
  d.answered = true;
  // Else the upload's timer wakes for the watch and finds the header.
  if (d.watching && d.deadline) d.deadline->cancel();
  if (x.hold) {
    // relay_held(): the request's writer runs on its own and keeps its notes on the wire.
    UpstreamPool::Wire& wire = *x.hold->wire;
    wire.answered = true;
    if (wire.head_deadline) wire.head_deadline->cancel();
    d.write_error = wire.write_error;
    d.timed_out = d.timed_out || wire.timed_out;
  }
  if (NoResponse failure = no_response(got, d.write_error, d.timed_out); !failure.detail.empty()) {
    x.timed_out = failure.timed_out;
    x.stale = failure.stale;
    x.failure = upstream_where(x.upstream, x.server) + ": " + failure.detail;
  } else if (d.rparser->get().result_int() == 101 &&
             !upgrade_names(d.rparser->get().base(), "websocket")) {
    // RFC 9110 §7.8: the server switches to a protocol the client listed, and says which.
    x.failure = upstream_where(x.upstream, x.server) + ": the upstream switched protocols to '" +
                std::string(d.rparser->get()[bhttp::field::upgrade]) +
                "', not the websocket the client asked for";
  } else if (d.rparser->get().result_int() == 101) {
    x.tunnel = true;
  } else if (x.hold) {
    co_await hold_answer(x, d);
  } else {
    co_await respond(x, d);
  }
  if (!x.failure.empty()) d.up.tcp().close();
  end_exchange(x, d);
}

/// A held exchange's clock, an entry of the thread's deadline list: nothing runs beside the
/// download of a quick exchange. Past kWatchAfter it starts the client watch (C48); past
/// `head_by` without a response header it closes the upstream connection (504).
struct HeldClock : common::DeadlineList::Entry {
  /// Due at the earlier of `watch` (the client watch starts; max: no client to watch) and
  /// `head` (no response header by then → 504).
  HeldClock(RelayState& state, Duplex& duplex, common::DeadlineList& deadlines,
            Clock::time_point watch, Clock::time_point head)
      : x(state), d(duplex), list(deadlines), watch_at(watch), head_by(head) {
    deadline = std::min(watch_at, head_by);
    on_due = &HeldClock::due;
  }
  RelayState& x;
  Duplex& d;
  common::DeadlineList& list;
  Clock::time_point watch_at;
  Clock::time_point head_by;
  bool watch_started = false;
  bool watch_done = false;

  /// Sets the entry's deadline to the next moment it has something to do, if any.
  bool next(Clock::time_point now) {
    if (d.ended) return false;
    if (!d.answered && now >= head_by) {
      d.timed_out = true;
      d.up.tcp().close();  // the download fails and reports the timeout
      return false;
    }
    if (!watch_started && now >= watch_at) start_watch();
    // Answered: nothing left to do but a watch still to start.
    if (d.answered && (watch_started || watch_at == Clock::time_point::max())) return false;
    deadline = d.answered ? watch_at : watch_started ? head_by : std::min(watch_at, head_by);
    return true;
  }

  void start_watch() {
    watch_started = true;
    d.watching = true;
    asio::co_spawn(x.in->client.get_executor(), watch(x, d), [this](const std::exception_ptr&) {
      watch_done = true;
      if (d.deadline) d.deadline->cancel();
    });
  }

  static void due(common::DeadlineList::Entry& entry) {
    auto& clock = static_cast<HeldClock&>(entry);
    if (clock.next(Clock::now())) clock.list.add(clock);
  }
};

/// A request whose body is held whole (C08): one write, then the download, with a deadline
/// entry instead of a task beside them (the parallel upload and download cost a quick exchange
/// two coroutines and their group). The write and the response header each have
/// request_timeout. True when the upstream closed the connection before answering and the
/// client is still there: the request may go again (C08, UpstreamPool::attempts).
asio::awaitable<bool> held_exchange(RelayState& x, Duplex& d, common::DeadlineList& deadlines) {
  const auto request_timeout =
      std::chrono::duration_cast<Clock::duration>(x.upstream.request_timeout);
  const auto start = Clock::now();
  HeldClock clock(x, d, deadlines, start + kWatchAfter, start + request_timeout);
  {
    common::DeadlineList::Guard guard(deadlines, clock);
    d.up.tcp().expires_never();  // timed by the clock, not by a deadline left from the connect
    if (const auto request = held_request(x)) {
      // Most requests go at once, in one sendmsg without an asynchronous operation.
      error_code ec;
      const std::size_t sent = d.up.write_now(*request, ec);
      if (!ec && sent < beast::buffer_bytes(*request))
        ec = co_await write_rest(d.up, *request, sent);
      d.write_error = ec;
    } else {
      d.write_error = co_await send_serialized(x, d);
    }
    d.uploaded = true;
    // The response header's time counts from the request's end. The entry may wake before it;
    // it then looks again.
    if (!d.timed_out) clock.head_by = Clock::now() + request_timeout;
    co_await download(x, d);
  }
  if (clock.watch_started && !clock.watch_done) {
    // download() ended the watch's read: wait for the task to finish with x and d.
    d.deadline =
        std::make_unique<asio::steady_timer>(x.in->client.get_executor(), Clock::time_point::max());
    while (!clock.watch_done) co_await d.deadline->async_wait(use_nothrow);
  }
  co_return x.stale && !x.out.client_closed;
}

constexpr std::size_t kRenderedHeadBytes = UpstreamPool::kRenderedHeadBytes;

// The request on `wire`'s connection; runs beside the response's read (C47) and may outlive it
// (a tail), so it shares the wire and the request. Closing the connection ends it. `sent` bytes
// of it went already (write_at_once): its head then is what render_head renders.
asio::awaitable<void> write_request(std::shared_ptr<UpstreamPool::Wire> wire,
                                    std::shared_ptr<const Request> request, std::size_t sent) {
  ByteStream stream = UpstreamPool::stream_of(*wire->lease.connection);
  boost::system::error_code ec;
  if (sent == 0) {
    std::tie(ec, std::ignore) = co_await bhttp::async_write(stream, *request, use_nothrow);
  } else {
    std::string head(kRenderedHeadBytes, '\0');
    head.resize(render_head(request->base(), head.data(), head.size()));
    const std::array<asio::const_buffer, 2> message{asio::buffer(head),
                                                    asio::buffer(request->body())};
    ec = co_await write_rest(stream, message, sent);
  }
  wire->write_error = ec;
  wire->writing = false;
}

// Writes `request` in one sendmsg when the connection takes it at once (ByteStream::write_now),
// its head rendered into `scratch`: no coroutine, serializer or asynchronous operation, as relay()
// writes a held request. Returns the bytes written (0 when not tried: TLS, a chunked body, a head
// past `scratch`); the whole request was written, or failed, when `wire->writing` is false.
std::size_t write_at_once(UpstreamPool::Wire& wire, const Request& request,
                          std::array<char, kRenderedHeadBytes>& scratch) {
  ByteStream stream = UpstreamPool::stream_of(*wire.lease.connection);
  if (stream.is_tls() || request.chunked()) return 0;
  const std::size_t head_size = render_head(request.base(), scratch.data(), scratch.size());
  if (head_size == 0) return 0;
  const std::array<asio::const_buffer, 2> message{asio::buffer(scratch.data(), head_size),
                                                  asio::buffer(request.body())};
  boost::system::error_code ec;
  const std::size_t sent = stream.write_now(message, ec);
  if (ec || sent == head_size + request.body().size()) {
    wire.write_error = ec;
    wire.writing = false;
  }
  return sent;
}

// A request whose body comes from `source` as it arrives (SPEC C50), each write within the
// upstream's `idle_timeout`; Content-Length framing when the request has one, else chunked.
// A source that fails (the client left or stalled) closes the connection: the upstream gets a
// visibly incomplete request. Once it is all out, the response header has `request_timeout`.
asio::awaitable<void> write_streamed_request(std::shared_ptr<UpstreamPool::Wire> wire,
                                             std::shared_ptr<const Request> request,
                                             std::shared_ptr<RequestBodySource> source,
                                             Duration idle_timeout, Duration request_timeout) {
  ByteStream stream = UpstreamPool::stream_of(*wire->lease.connection);
  bhttp::request<bhttp::buffer_body> out{request->base()};
  out.body().data = nullptr;
  out.body().size = 0;
  out.body().more = true;
  bhttp::request_serializer<bhttp::buffer_body> sr{out};
  stream.tcp().expires_after(idle_timeout);
  auto [ec, n] = co_await bhttp::async_write_header(stream, sr, use_nothrow);
  std::string piece;
  bool done = false;
  while (!ec && !done) {
    if (const auto sec = co_await source->next(piece, done)) {
      wire->write_error = sec;
      wire->writing = false;
      if (wire->lease.connection) UpstreamPool::stream_of(*wire->lease.connection).tcp().close();
      co_return;
    }
    if (!wire->lease.connection) co_return;  // the exchange is over
    out.body().data = piece.empty() ? nullptr : piece.data();
    out.body().size = piece.size();
    out.body().more = !done;
    stream.tcp().expires_after(idle_timeout);
    auto [wec, wn] = co_await bhttp::async_write(stream, sr, use_nothrow);
    ec = wec == bhttp::error::need_buffer ? boost::system::error_code() : wec;
  }
  wire->write_error = ec;
  wire->writing = false;
  if (wire->answered || !wire->lease.connection) co_return;
  // A failed write ends nothing by itself: the upstream may have answered (C47).
  auto& deadline = wire->head_deadline.emplace(stream.get_executor());
  deadline.expires_after(request_timeout);
  auto [tec] = co_await deadline.async_wait(use_nothrow);
  if (!tec && !wire->answered && wire->lease.connection) {
    wire->timed_out = true;
    UpstreamPool::stream_of(*wire->lease.connection).tcp().close();
  }
}

/// relay_held()'s exchange on `x.hold->wire`: the request goes out whole (at once when the
/// connection takes it) or from `source` as it arrives, on a writer of its own that may outlive
/// the exchange (C47: a complete answer may come before it is done), while the answer is read.
/// A whole request's answer must arrive within request_timeout of the start, a streamed one's
/// header within request_timeout of the request's end. True when the upstream closed the
/// connection before answering (C08, UpstreamPool::attempts).
asio::awaitable<bool> hold_exchange(RelayState& x, Duplex& d,
                                    std::shared_ptr<const Request> request,
                                    std::shared_ptr<RequestBodySource> source, UpstreamPool& pool) {
  const std::shared_ptr<UpstreamPool::Wire>& wire = x.hold->wire;
  const auto executor = d.up.get_executor();
  if (source) {
    // Each write within idle_timeout; the header's deadline starts once the body is out. The
    // writer may run at once up to its first write: the read's expiry is cleared after it.
    asio::co_spawn(executor,
                   write_streamed_request(wire, request, std::move(source), x.upstream.idle_timeout,
                                          x.upstream.request_timeout),
                   common::log_on_exception("upstream request write failed"));
    co_await download(x, d);
    co_return x.stale;
  }
  d.answer_by =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(x.upstream.request_timeout);
  HeldClock clock(x, d, pool.deadlines(), Clock::time_point::max(), d.answer_by);
  common::DeadlineList::Guard guard(pool.deadlines(), clock);
  const std::size_t sent = write_at_once(*wire, *request, pool.head_scratch());
  if (wire->writing) {
    asio::co_spawn(executor, write_request(wire, request, sent),
                   common::log_on_exception("upstream request write failed"));
  }
  co_await download(x, d);
  co_return x.stale;
}

/// C40: the upgrade is confirmed; relays the 101 with its Upgrade, then bytes both ways until a
/// side closes, a read or write fails, or nothing moved for `limits.tunnel_idle_timeout`.
asio::awaitable<void> tunnel(RelayState& x, Duplex& d) {
  using namespace asio::experimental::awaitable_operators;
  auto& in = *x.in;
  auto& out = x.out;
  const Limits& limits = *in.limits;
  ByteStream up = d.up;
  auto& res = d.rparser->get();
  out.status = 101;
  out.outcome = "passthrough";
  const std::string protocol(res[bhttp::field::upgrade]);
  strip_hop_by_hop(res.base());
  in.handler->strip_owned_fields(res.base());
  res.version(11);
  res.set(bhttp::field::connection, "upgrade");
  res.set(bhttp::field::upgrade, protocol);
  finish_head(in, res.base(), nullptr);  // Beast's serializer writes this head
  res.body().data = nullptr;
  res.body().size = 0;
  res.body().more = false;
  bhttp::response_serializer<bhttp::buffer_body> rs{res};
  in.client.tcp().expires_after(limits.idle_timeout);
  auto [wec, wn] = co_await bhttp::async_write_header(in.client, rs, use_nothrow);
  if (wec) {
    out.cut = "writing the 101 failed: " + wec.message();
    co_return;
  }
  out.outcome = "tunnel";
  out.tunnel = true;
  if (in.tunnel_observer) in.tunnel_observer(true);
  // The per-direction buffers of a tunnel; the upstream's read buffer may still hold bytes
  // of the new protocol that came with the 101.
  std::uint64_t in_bytes = 0;
  std::uint64_t out_bytes = 0;
  const auto e1 =
      co_await flush_leftover(*in.client_buffer, up, limits.tunnel_idle_timeout, in_bytes);
  const auto e2 =
      e1 ? e1 : co_await flush_leftover(d.ubuf, in.client, limits.tunnel_idle_timeout, out_bytes);
  TunnelState state(in.client.get_executor());
  if (!e1 && !e2) {
    StreamBuffer down_buffer(limits.stream_buffer);
    co_await (
        pump(in.client, up, *x.up_buffer, state, in_bytes, "client", limits.tunnel_idle_timeout) &&
        pump(up, in.client, down_buffer, state, out_bytes, "upstream",
             limits.tunnel_idle_timeout) &&
        watchdog(state, limits.tunnel_idle_timeout, in.client, up));
  } else {
    state.ended_by = "writing failed: " + (e1 ? e1 : e2).message();
    in.client.tcp().close();
    up.tcp().close();
  }
  if (in.tunnel_observer) in.tunnel_observer(false);
  out.bytes_in = in_bytes;
  out.bytes_out = out_bytes;
  out.written = !state.idle;
  out.client_closed = state.ended_by.rfind("client", 0) == 0;
  if (state.idle) out.cut = "nothing moved for tunnel_idle_timeout";
  out.keep_alive = false;
}

/// Both directions at once from the first byte (C47), the client watched (C48): a request
/// whose body is streamed. A frame of its own, so that relay()'s stays small. Never retried
/// (false): the body went out as it arrived.
asio::awaitable<bool> duplex_exchange(RelayState& x, Duplex& d) {
  using namespace asio::experimental::awaitable_operators;
  co_await (upload(x, d) && download(x, d));
  co_return false;
}

// The rare paths of relay() as plain functions: their temporaries stay on the stack instead of
// in relay()'s coroutine frame.

/// Reading a held request body failed before anything went to the upstream.
void body_failed(RelayOutcome& out, const error_code& ec) {
  out.cut = "reading the request body failed: " + ec.message();
  out.request_error = ec;
  out.client_closed = closed_before_answer(ec) || ec == bhttp::error::partial_message;
  out.outcome = "passthrough";
}

/// A request without Host (HTTP/1.0) gets the upstream server's `host:port`.
void set_host(bhttp::fields& fields, const common::HostPort& server) {
  fields.set(bhttp::field::host, common::format_host_port(server));
}

/// No response from the upstream: the problem answer the session writes (C05).
void upstream_failed(RelayState& x, bool reached) {
  RelayOutcome& out = x.out;
  out.outcome = "upstream_error";
  out.keep_alive = x.in->client_keep_alive && x.parser->is_done();
  const Problem problem = !reached      ? Problem::upstream_unreachable
                          : x.timed_out ? Problem::upstream_timeout
                                        : Problem::upstream_failed;
  out.problem = make_problem(problem, x.failure, x.in->client_version, out.keep_alive);
}

}  // namespace

asio::awaitable<error_code> write_response(ByteStream client,
                                           const bhttp::response_header<>& header,
                                           asio::const_buffer body, const Limits& limits) {
  StreamBuffer scratch(limits.stream_buffer);
  const std::size_t head_size = render_head(header, scratch.data(), scratch.size());
  co_return co_await write_whole(client, header, head_size, body, scratch, limits.idle_timeout);
}

asio::awaitable<TailOutcome> send_tail(ByteStream client, const bhttp::response_header<>& header,
                                       ResponseTail& tail, const Limits& limits) {
  TailOutcome out;
  auto& res = tail.parser->get();
  res.base() = header;
  res.erase(bhttp::field::content_length);
  out.keep_alive = frame_streamed(res, *tail.parser, false, res.keep_alive());
  StreamBuffer down(limits.stream_buffer);
  bhttp::response_serializer<bhttp::buffer_body> rs{res};
  RelayOutcome cut;
  const auto ec =
      co_await pass_body(tail.stream(), tail.buffer, *tail.parser, rs, client, tail.prefix, down,
                         tail.idle_timeout(), limits.idle_timeout, tail.upstream_name(), cut);
  if (ec) {
    out.keep_alive = false;
    out.cut = std::move(cut.cut);
    client.tcp().close();
    co_return out;
  }
  out.written = true;
  tail.finish();
  co_return out;
}

asio::awaitable<error_code> read_tail_piece(ResponseTail& tail, char* data, std::size_t size,
                                            std::size_t& got, bool& done) {
  got = 0;
  done = false;
  error_code ec;
  if (!tail.prefix.empty()) {
    got = std::min(size, tail.prefix.size());
    std::copy_n(tail.prefix.data(), got, data);
    tail.prefix.erase(0, got);
  } else if (!tail.parser->is_done()) {
    ec = co_await read_body_piece(tail.stream(), tail.buffer, *tail.parser, data, size,
                                  tail.idle_timeout());
    got = ec ? 0 : size - tail.parser->get().body().size;
  }
  if (!ec && tail.prefix.empty() && tail.parser->is_done()) {
    done = true;
    tail.finish();
  }
  co_return ec;
}

asio::awaitable<void> relay(RelayRequest& in, RelayOutcome& out) {
  // The session holds the configuration snapshot these point into until the relay returns.
  const Limits& limits = *in.limits;
  const Upstream& upstream = *in.upstream;
  StreamRequestParser& parser = *in.parser;
  auto& req = parser.get();
  const auto start = Clock::now();
  const std::size_t piece = limits.stream_buffer;
  StreamBuffer up_buffer(piece);  // client → upstream

  // The request as the upstream gets it (HTTP/1.1, C02 already applied by the session).
  const bool chunked_in = parser.chunked();
  const bool has_body = !parser.is_done();
  req.version(11);
  if (in.websocket) {
    req.set(bhttp::field::connection, "upgrade");
    req.set(bhttp::field::upgrade, "websocket");
  } else {
    set_keep_alive(req, true);
  }
  if (chunked_in) req.chunked(true);

  RelayState x{out, upstream};
  x.in = &in;
  x.parser = &parser;
  x.up_buffer = &up_buffer;
  x.head = in.head;
  x.websocket = in.websocket;
  // A short body of known length is read first: it can be sent again after a stale pooled
  // connection (C08). Longer and chunked bodies go out as they arrive.
  if (has_body && !chunked_in && parser.content_length() && *parser.content_length() <= piece) {
    while (!parser.is_done()) {
      const std::size_t room = piece - x.held;
      // A body that came with its header is taken without a read (or a task).
      req.body().data = up_buffer.data() + x.held;
      req.body().size = room;
      parser.eager(true);
      const auto taken = put_buffered(*in.client_buffer, parser, room);
      error_code ec;
      if (taken) {
        ec = *taken;
      } else {
        ec = co_await read_body_piece(in.client, *in.client_buffer, parser,
                                      up_buffer.data() + x.held, room, limits.idle_timeout);
      }
      if (ec) {
        body_failed(out, ec);
        co_return;
      }
      x.held += room - req.body().size;
    }
  } else if (has_body) {
    x.retryable = false;
  }

  std::optional<Duplex> d;
  const auto exchange_on = [&](UpstreamPool::Lease& lease) {
    x.server = lease.server;
    if (req.count(bhttp::field::host) == 0) set_host(req, x.server);
    d.emplace(UpstreamPool::stream_of(*lease.connection));
    x.failure.clear();
    x.stale = x.timed_out = false;
    return x.retryable ? held_exchange(x, *d, *in.deadlines) : duplex_exchange(x, *d);
  };
  UpstreamPool::Attempts ran = co_await in.pool->attempts(upstream, x.retryable, exchange_on);
  if (!ran.exchanged) x.failure = std::move(ran.lease.detail);
  out.upstream_time = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);

  if (out.client_closed || (out.request_error && out.status == 0)) {
    // The client left, or its body failed before any response byte (the session answers 400
    // or 413 when it can, C03, C38); the upstream connection is already closed.
    if (out.outcome.empty()) out.outcome = "passthrough";
    out.keep_alive = false;
    co_return;
  }
  if (!x.failure.empty()) {
    upstream_failed(x, ran.reached);
    co_return;
  }
  if (!x.tunnel) {
    if (x.reusable) in.pool->give_back(upstream, std::move(ran.lease), x.upstream_keep_alive);
    co_return;
  }
  co_await tunnel(x, *d);
}

asio::awaitable<ForwardResult> relay_held(UpstreamPool& pool, const Upstream& upstream_ref,
                                          Request request_in, std::size_t hold_limit,
                                          std::shared_ptr<RequestBodySource> body) {
  // A copy: the reference is only promised until the first suspension.
  const Upstream upstream = upstream_ref;
  const auto start = Clock::now();
  ForwardResult result;

  request_in.version(11);
  set_keep_alive(request_in, true);
  request_in.erase(bhttp::field::transfer_encoding);
  if (body) {
    // Its length as the client declared it, else chunked (C50).
    if (!request_in.has_content_length()) request_in.chunked(true);
  } else if (!request_in.body().empty() || request_in.has_content_length()) {
    request_in.content_length(request_in.body().size());
  }
  // An HTTP/1.0 client may omit Host, which an HTTP/1.1 request must carry (RFC 9112 §3.2).
  const bool client_sent_host = request_in.count(bhttp::field::host) > 0;
  auto request = std::make_shared<Request>(std::move(request_in));

  RelayOutcome notes;
  HeldAnswer answer;
  answer.hold_limit = hold_limit;
  RelayState x{notes, upstream};
  x.hold = &answer;
  x.head = request->method() == bhttp::verb::head;
  std::optional<Duplex> d;
  const auto exchange_on = [&](UpstreamPool::Lease& lease) {
    x.server = lease.server;
    if (!client_sent_host) set_host(*request, x.server);
    answer.wire = std::make_shared<UpstreamPool::Wire>(std::move(lease));
    d.emplace(UpstreamPool::stream_of(*answer.wire->lease.connection));
    x.failure.clear();
    x.stale = x.timed_out = false;
    return hold_exchange(x, *d, request, body, pool);
  };
  // A body that follows as it arrives cannot be sent twice: a fresh connection (C08).
  UpstreamPool::Attempts ran = co_await pool.attempts(upstream, body == nullptr, exchange_on);
  if (!ran.exchanged) {
    // Not reached at all, or a stale pooled connection whose reconnect failed.
    result.kind =
        ran.reached ? ForwardResult::Kind::unknown_outcome : ForwardResult::Kind::not_reached;
    result.detail = ran.reached ? "a pooled connection closed; " + std::move(ran.lease.detail)
                                : std::move(ran.lease.detail);
  } else if (!x.failure.empty()) {
    result.kind =
        x.timed_out ? ForwardResult::Kind::timed_out : ForwardResult::Kind::unknown_outcome;
    result.detail = std::move(x.failure);
  } else {
    result.kind = ForwardResult::Kind::response;
    result.response = std::move(answer.response);
    if (answer.pass_on) {
      result.tail = std::make_shared<ResponseTail>(pool, upstream, std::move(answer.wire),
                                                   std::move(d->rparser), std::move(d->ubuf),
                                                   std::move(answer.prefix));
    } else if (answer.reusable) {
      pool.give_back(upstream, std::move(answer.wire->lease), answer.keep_alive);
    }
  }
  result.upstream_time =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  co_return result;
}

}  // namespace idemgate::http
