#include "gateway/http/relay.hpp"

#include <algorithm>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <memory>
#include <vector>

#include "gateway/common/host_port.hpp"
#include "gateway/common/http_date.hpp"
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

using StreamResponseParser = bhttp::response_parser<bhttp::buffer_body>;

bool closed_before_answer(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted;
}

std::string server_text(const config::Server& server) {
  return common::format_host_port(server.host, server.port);
}

/// One piece of a body into [`data`, `data + size`) (async_read_body with a buffer_body parser):
/// on return body().size is what is left of `size`. `timeout` bounds each read (progress).
template <bool isRequest>
asio::awaitable<error_code> read_body_piece(ByteStream stream, beast::flat_buffer& buffer,
                                            bhttp::parser<isRequest, bhttp::buffer_body>& parser,
                                            char* data, std::size_t size,
                                            config::Duration timeout) {
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
                                        config::Duration timeout) {
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
                           std::uint64_t& moved, const char* side, config::Duration write_timeout) {
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

asio::awaitable<void> watchdog(TunnelState& state, config::Duration idle, ByteStream a,
                               ByteStream b) {
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
                                           config::Duration timeout, std::uint64_t& moved) {
  if (buffer.size() == 0) co_return error_code{};
  to.tcp().expires_after(timeout);
  auto [ec, n] = co_await asio::async_write(to, buffer.data(), use_nothrow);
  buffer.consume(n);
  moved += n;
  co_return ec;
}

}  // namespace

asio::awaitable<RelayOutcome> relay(RelayRequest in) {
  using namespace asio::experimental::awaitable_operators;
  // The session holds the configuration snapshot these point into until the relay returns.
  const config::Limits& limits = *in.limits;
  const config::Upstream& upstream = *in.upstream;
  StreamRequestParser& parser = *in.parser;
  auto& req = parser.get();
  RelayOutcome out;
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
    req.keep_alive(true);
  }
  if (chunked_in) req.chunked(true);

  // A short body of known length is read first: it can be sent again after a stale pooled
  // connection (C08). Longer and chunked bodies go out as they arrive.
  bool retryable = true;
  std::size_t held = 0;
  if (has_body && !chunked_in && parser.content_length() && *parser.content_length() <= piece) {
    while (!parser.is_done()) {
      const std::size_t room = piece - held;
      const auto ec = co_await read_body_piece(in.client, *in.client_buffer, parser,
                                               up_buffer.data() + held, room, limits.idle_timeout);
      if (ec) {
        out.cut = "reading the request body failed: " + ec.message();
        out.request_error = ec;
        out.outcome = "passthrough";
        co_return out;
      }
      held += room - req.body().size;
    }
  } else if (has_body) {
    retryable = false;
  }

  std::optional<UpstreamPool::Lease> lease;
  std::optional<StreamResponseParser> rparser;
  beast::flat_buffer ubuf{2 * kMaxResponseHeaderBytes};
  std::string failure;
  bool timed_out = false;
  bool reached = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 0) {
      lease.emplace(co_await in.pool->lease(upstream, retryable));
    } else {
      lease.emplace(co_await in.pool->reconnect(upstream, lease->server));
    }
    if (!lease->connection) {
      failure = lease->detail;
      reached = attempt > 0;
      break;
    }
    reached = true;
    ByteStream up = UpstreamPool::stream_of(*lease->connection);
    const std::string server = server_text(lease->server);
    if (req.count(bhttp::field::host) == 0) req.set(bhttp::field::host, server);

    // The request.
    error_code wec;
    bhttp::request_serializer<bhttp::buffer_body> sr{req};
    if (retryable) {
      req.body().data = held == 0 ? nullptr : up_buffer.data();
      req.body().size = held;
      req.body().more = false;
      up.tcp().expires_after(upstream.request_timeout);
      auto [ec, n] = co_await bhttp::async_write(up, sr, use_nothrow);
      wec = ec;
    } else {
      up.tcp().expires_after(upstream.idle_timeout);
      auto [ec, n] = co_await bhttp::async_write_header(up, sr, use_nothrow);
      wec = ec;
      while (!wec && !sr.is_done()) {
        const auto rec = co_await read_body_piece(in.client, *in.client_buffer, parser,
                                                  up_buffer.data(), piece, limits.idle_timeout);
        if (rec) {
          // The client failed, stalled or passed max_streamed_body: the upstream has a partial
          // request, so both connections end (C38).
          out.cut = rec == bhttp::error::body_limit
                        ? "the request body exceeds max_streamed_body (" +
                              std::to_string(limits.max_streamed_body) + " bytes)"
                        : "reading the request body failed: " + rec.message();
          out.request_error = rec;
          out.outcome = "passthrough";
          out.upstream_time =
              std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
          co_return out;
        }
        to_write(req, up_buffer.data(), piece, parser.is_done());
        wec = co_await write_piece(up, sr, upstream.idle_timeout);
      }
    }
    if (wec) {
      if (attempt == 0 && lease->pooled && retryable && wec != beast::error::timeout) continue;
      timed_out = wec == beast::error::timeout;
      failure = "upstream " + upstream.name + " (" + server +
                "): writing the request failed: " + wec.message();
      break;
    }

    // The response header: interim responses are dropped; 101 only after a WebSocket request.
    bool got_bytes = false;
    error_code hec;
    up.tcp().expires_after(upstream.request_timeout);
    for (;;) {
      rparser.emplace();
      rparser->header_limit(kMaxResponseHeaderBytes);
      rparser->body_limit(boost::none);
      if (in.head) rparser->skip(true);
      check_chunk_extensions(*rparser);
      auto [ec, n] = co_await bhttp::async_read_header(up, ubuf, *rparser, use_nothrow);
      if (ec) {
        got_bytes = got_bytes || rparser->got_some() || ubuf.size() > 0;
        hec = ec;
        break;
      }
      got_bytes = true;
      const unsigned status = rparser->get().result_int();
      if (status == 101 && in.websocket) break;
      const auto verdict = classify_response_header(status);
      if (verdict == ResponseHeaderVerdict::refused) {
        failure = "upstream " + upstream.name + " (" + server +
                  "): the upstream switched protocols without being asked to";
        break;
      }
      if (verdict == ResponseHeaderVerdict::bad_status) {
        failure = "upstream " + upstream.name + " (" + server + "): the upstream sent status " +
                  std::to_string(status) + ", under 100";
        break;
      }
      if (verdict == ResponseHeaderVerdict::final_response) break;
    }
    if (hec) {
      if (attempt == 0 && lease->pooled && retryable && !got_bytes && closed_before_answer(hec)) {
        continue;  // C08: the pooled connection was closed as the request went out
      }
      timed_out = hec == beast::error::timeout;
      failure = "upstream " + upstream.name + " (" + server + ")" +
                (timed_out ? " gave no response header within request_timeout"
                           : ": reading the response header failed: " + hec.message());
    }
    break;
  }
  out.upstream_time = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);

  if (!failure.empty()) {
    out.outcome = "upstream_error";
    out.keep_alive = in.client_keep_alive && parser.is_done();
    const Problem problem = !reached    ? Problem::upstream_unreachable
                            : timed_out ? Problem::upstream_timeout
                                        : Problem::upstream_failed;
    out.problem = make_problem(problem, failure, in.client_version, out.keep_alive);
    co_return out;
  }

  ByteStream up = UpstreamPool::stream_of(*lease->connection);
  auto& res = rparser->get();
  const unsigned status = res.result_int();
  out.status = status;
  out.outcome = "passthrough";
  const auto upstream_keep_alive = keep_alive_timeout(res.base());
  const bool upstream_reusable = rparser->keep_alive();

  if (status == 101) {
    // C40: the upgrade is confirmed; relay the 101 with its Upgrade, then bytes both ways.
    const std::string protocol(res[bhttp::field::upgrade]);
    strip_hop_by_hop(res.base());
    in.handler->strip_owned_fields(res.base());
    res.version(11);
    res.set(bhttp::field::connection, "upgrade");
    res.set(bhttp::field::upgrade, protocol.empty() ? std::string("websocket") : protocol);
    res.set(bhttp::field::date, common::http_date_now());
    append_to_list(res.base(), "Via", kViaEntry);
    if (!in.request_id.empty()) res.set(in.request_id_header, in.request_id);
    res.body().data = nullptr;
    res.body().size = 0;
    res.body().more = false;
    bhttp::response_serializer<bhttp::buffer_body> rs{res};
    in.client.tcp().expires_after(limits.idle_timeout);
    auto [wec, wn] = co_await bhttp::async_write_header(in.client, rs, use_nothrow);
    if (wec) {
      out.cut = "writing the 101 failed: " + wec.message();
      co_return out;
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
        e1 ? e1 : co_await flush_leftover(ubuf, in.client, limits.tunnel_idle_timeout, out_bytes);
    TunnelState state(in.client.get_executor());
    if (!e1 && !e2) {
      StreamBuffer down_buffer(piece);
      co_await (
          pump(in.client, up, up_buffer, state, in_bytes, "client", limits.tunnel_idle_timeout) &&
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
    if (state.idle) out.cut = "nothing moved for tunnel_idle_timeout";
    out.keep_alive = false;
    co_return out;
  }

  // The response header as the client gets it.
  const bool bodyless = !status_has_body(status);
  const bool length_known = rparser->content_length().has_value();
  strip_hop_by_hop(res.base());
  in.handler->strip_owned_fields(res.base());
  if (in.route) in.handler->add_route_fields(*in.route, in.origin, res.base());
  res.version(in.client_version);
  res.set(bhttp::field::date, common::http_date_now());
  append_to_list(res.base(), "Via", kViaEntry);
  if (!in.request_id.empty()) res.set(in.request_id_header, in.request_id);
  bool keep_alive = in.client_keep_alive && parser.is_done();
  if (bodyless) {
    res.erase(bhttp::field::content_length);
  } else if (in.head || length_known) {
    // The upstream's Content-Length, which for HEAD describes what a GET would return (C16).
  } else if (in.client_version >= 11) {
    res.chunked(true);
  } else {
    keep_alive = false;  // HTTP/1.0: the body ends with the connection (C03)
  }
  res.keep_alive(keep_alive);
  out.keep_alive = keep_alive;

  StreamBuffer down_buffer(piece);
  bhttp::response_serializer<bhttp::buffer_body> rs{res};
  error_code ec;
  if (bodyless || in.head || rparser->is_done()) {
    // No body to read: the header (and an empty last chunk when chunked) goes out alone.
    res.body().data = nullptr;
    res.body().size = 0;
    res.body().more = false;
    ec = co_await write_piece(in.client, rs, limits.idle_timeout);
    if (ec) out.cut = "writing the response failed: " + ec.message();
  } else {
    ec = co_await write_piece(in.client, rs, limits.idle_timeout);  // the header first (C38)
    if (ec) out.cut = "writing the response failed: " + ec.message();
    while (!ec && !rs.is_done()) {
      const auto rec = co_await read_body_piece(up, ubuf, *rparser, down_buffer.data(), piece,
                                                upstream.idle_timeout);
      if (rec) {
        out.cut =
            "upstream " + upstream.name + ": reading the response body failed: " + rec.message();
        ec = rec;
        break;
      }
      to_write(res, down_buffer.data(), piece, rparser->is_done());
      ec = co_await write_piece(in.client, rs, limits.idle_timeout);
      if (ec) out.cut = "writing the response failed: " + ec.message();
    }
  }
  if (ec) {
    out.keep_alive = false;
    in.client.tcp().close();
    co_return out;  // the lease goes: the upstream connection closes with it
  }
  out.written = true;
  if (upstream_reusable && ubuf.size() == 0 && rparser->is_done() &&
      (length_known || rparser->chunked() || bodyless || in.head)) {
    in.pool->give_back(upstream, std::move(*lease), upstream_keep_alive);
  }
  co_return out;
}

}  // namespace idemgate::http
