#include "gateway/http/session.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <boost/json/object.hpp>
#include <boost/url/parse.hpp>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>

#include "gateway/common/http_date.hpp"
#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/answer.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/http/h2_session.hpp"
#include "gateway/http/header_deadlines.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/relay.hpp"
#include "gateway/http/request_id.hpp"
#include "gateway/http/request_rules.hpp"
#include "gateway/http/router.hpp"
#include "gateway/http/traceparent.hpp"

namespace idemgate::http {

using common::format_rfc3339;
using common::log_access;
using common::log_json;
using common::use_nothrow;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kReadChunk = 4096;
/// The bound of a connection's read buffer: a header section of max_header_bytes and room for a
/// chunk-size line or trailer section beside it (Beast holds either whole before parsing it).
std::size_t read_buffer_bytes(const Limits& limits) {
  return limits.max_header_bytes + 4 * kReadChunk;
}
/// The first read of a connection (nginx's client_header_buffer_size): a request header of
/// usual size fits it, and a connection that sends little (an idle one, a slow header: C54)
/// holds no more; the buffer grows when a request needs it.
constexpr std::size_t kFirstRead = 1024;

/// max_header_bytes as Beast's parsers take it (C04).
std::uint32_t header_limit_of(const Limits& limits) {
  return static_cast<std::uint32_t>(
      std::min<std::size_t>(limits.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
}

/// Whether `buffer` holds a whole header section, or one a parser already refuses (the real
/// parser then reports the same error): the whole section is read before Beast parses it, so
/// that it can be checked for obs-fold, which the parser would unfold out of sight.
bool header_section_complete(const beast::flat_buffer& buffer, std::uint32_t header_limit) {
  // The usual case, without a parser (which would build every field only to drop it): the
  // empty line that ends the section is there, within the limit.
  const std::string_view bytes(static_cast<const char*>(buffer.data().data()),
                               std::min<std::size_t>(buffer.size(), header_limit));
  if (bytes.find("\r\n\r\n") != std::string_view::npos) return true;
  bhttp::request_parser<bhttp::empty_body> probe;
  probe.header_limit(header_limit);
  boost::system::error_code ec;
  probe.put(buffer.data(), ec);
  return ec != bhttp::error::need_more;
}

/// Where the next read of a request goes: kFirstRead into an empty buffer, else the room the
/// buffer already has (beast::read_size: at least 512 bytes, growing it when less is left).
/// Preparing kReadChunk behind bytes already read would reallocate and copy the buffer at every
/// read of a header arriving a few bytes at a time: a slowloris client's every byte (C54).
beast::flat_buffer::mutable_buffers_type read_room(beast::flat_buffer& buffer) {
  return buffer.prepare(buffer.capacity() == 0 ? kFirstRead : beast::read_size(buffer, kReadChunk));
}

/// The end of one read of `socket` into `buffer` timed by an entry of the thread's deadline list
/// (C07, C54): commits the `n` bytes read; a connection the entry closed at its deadline after
/// they arrived is not served (operation_aborted), since its answer could not be written.
boost::system::error_code read_by_entry_ended(const tcp::socket& socket, beast::flat_buffer& buffer,
                                              boost::system::error_code ec, std::size_t n) {
  buffer.commit(n);
  if (!ec && !socket.is_open()) ec = asio::error::operation_aborted;
  return ec;
}

/// rejection_for() an error met while reading a request body: past the header, a line that does
/// not fit the session's read buffer is a chunk-size line or the trailer section (C04).
std::optional<Rejection> body_rejection(const boost::system::error_code& ec, const Limits& limits) {
  auto rejection = rejection_for(ec, limits);
  if (rejection && (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)) {
    rejection->detail = "a chunk-size line or the trailer section exceeds the " +
                        std::to_string(read_buffer_bytes(limits)) +
                        "-byte read buffer (max_header_bytes + 16 KiB)";
  }
  return rejection;
}

/// After a response that ends the connection, how long to read and discard what the client still
/// sends: closing with unread input makes the kernel send a reset that can destroy the response.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr std::size_t kLingerMaxBytes = 1024 * 1024;

/// `request_id` ("" when the request has none) replaces any such field of the upstream's or the
/// stored response: the field names this request (conf/REFERENCE.md, "request_id").
void finalize_response(Response& res, unsigned version, bool keep_alive, bool head,
                       const RequestId& ids, std::string_view request_id) {
  finalize_answer(res, head, ids.header, request_id);
  res.version(version);
  res.keep_alive(keep_alive);
}

/// Session over a plain (beast::tcp_stream) or TLS (TlsStream) stream; timeouts and closing act
/// on the TCP layer underneath.
template <class Stream>
class BasicSession final : public Session {
 public:
  template <class... Args>
  BasicSession(std::shared_ptr<SessionContext> context, Args&&... stream_args);
  ~BasicSession() override;

  /// Serves requests until the connection ends. Never throws for network errors.
  asio::awaitable<void> run();
  void drain() override;
  void close() override;

 private:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  enum class State { idle, busy };
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }
  using HeldParser = bhttp::request_parser<bhttp::string_body>;
  /// What a request's access line says besides its timing (SPEC C32); views into what the
  /// caller holds until log_done returns.
  struct Done {
    const Route* route = nullptr;  ///< null: no route matched (or none was looked up)
    std::string_view method;
    std::string_view target;
    unsigned status = 0;
    std::string_view outcome;
    std::string_view key_hash;
    std::chrono::microseconds upstream_time{0};
    bool written = false;    ///< the whole answer reached the client
    std::string_view ended;  ///< "client_closed" when the client left first (C48), else ""
  };

  /// Serves the request whose header section `buffer` holds whole (or wrongly: the parser
  /// then reports it), `started` at its first byte, under `config`. False when the connection
  /// is to close after it.
  asio::awaitable<bool> serve_one(beast::flat_buffer& buffer,
                                  std::shared_ptr<const ProxyConfig> config,
                                  Clock::time_point started);
  /// One read into `buffer` that must complete by `deadline` (C07), else the connection is
  /// closed; `n` bytes were committed.
  asio::awaitable<std::tuple<boost::system::error_code, std::size_t>> read_some_by(
      beast::flat_buffer& buffer, Clock::time_point deadline);
  /// Reads until `buffer` holds a whole header section (or one the parser refuses), by
  /// `deadline` (C07); false when the connection ended first (EOF, reset, the deadline, a
  /// drain). A small frame of its own, so that a slow client (slowloris, C54) holds no frame of
  /// serve_one while its header trickles in.
  asio::awaitable<bool> complete_header(beast::flat_buffer& buffer, std::uint32_t header_limit,
                                        Clock::time_point deadline);
  /// Parses the head that `buffer` holds whole into `parser` and checks it (obs-fold, framing,
  /// Host, absolute-form: C03): the rejection of a request the gateway refuses, if it is one.
  std::optional<Rejection> parse_head(beast::flat_buffer& buffer, HeldParser& parser,
                                      const Limits& limits);
  /// Writes `100 Continue` (RFC 9110 §10.1.1) within idle_timeout; false when it failed.
  asio::awaitable<bool> send_continue(const Limits& limits);
  /// Reads the body of a request the handler holds, bounded by max_request_body (C04), each read
  /// within idle_timeout (C07); sets `reject` for a body the gateway refuses. False when the
  /// connection itself failed.
  asio::awaitable<bool> read_held_body(beast::flat_buffer& buffer, HeldParser& parser,
                                       const Limits& limits, std::optional<Rejection>& reject);
  /// The finaliser of answers the session writes (the handler's, and the gateway's own):
  /// the route's fields (C57), hop-by-hop fields removed, Date, Via, the request id, framing;
  /// then written, each write within idle_timeout (C07), or its tail streamed (C39). True when
  /// the whole answer was written; `keep_alive` false when the connection cannot carry more.
  asio::awaitable<bool> write_answer(HandlerResult& result, const Route* route,
                                     std::string_view origin, const ProxyConfig& config,
                                     unsigned version, bool head, bool& keep_alive);
  /// The access line (C32) and the request_done observer of one answered request.
  void log_done(const Done& done, Clock::time_point started);
  /// The answer to a held request, as an awaitable: the rejection's, or the handler's
  /// (answer_routed). Not a coroutine, so that serve_held's frame keeps neither the request nor
  /// the routed copy of it. Sets `keep_alive` for a routed request (the handler may clear it).
  asio::awaitable<HandlerResult> answer_held(Request request,
                                             const std::shared_ptr<const ProxyConfig>& config,
                                             const Route* route, Admission::Ticket& in_flight,
                                             bool shed, bool shed_unread_body,
                                             std::optional<Rejection>& reject, unsigned version,
                                             bool asked_keep_alive, bool& keep_alive);
  /// The rest of serve_one for a request the handler holds (or the gateway refuses): the
  /// handler's answer, or the rejection's, written and logged. False when the connection is to
  /// close after it.
  /// The references point into serve_one's frame, which outlives it.
  asio::awaitable<bool> serve_held(HeldParser& parser,
                                   const std::shared_ptr<const ProxyConfig>& config,
                                   const Route* route, Admission::Ticket& in_flight, bool shed,
                                   bool shed_unread_body, std::optional<Rejection>& reject,
                                   unsigned version, std::string_view origin,
                                   Clock::time_point started);
  /// A routed request that the handler does not hold, streamed (SPEC C38) or tunnelled (C40).
  asio::awaitable<bool> stream_one(beast::flat_buffer& buffer, HeldParser& parser,
                                   const ProxyConfig& config, const Route& route,
                                   const Upstream& upstream, Clock::time_point started,
                                   std::string_view origin);
  /// Writes a streamed exchange's problem answer (`outcome.problem`: the relay wrote nothing)
  /// and logs an upstream failure; sets `written` and `status`. A frame of its own, as the
  /// rare path it is.
  asio::awaitable<void> write_problem(RelayOutcome& outcome, const ProxyConfig& config,
                                      const Route& route, const Upstream& upstream,
                                      std::string_view origin, unsigned version, bool head);
  /// The lines of a streamed exchange: a cut, and its access line (a tunnel's with its bytes).
  void log_streamed(const RelayOutcome& outcome, const Route& route, std::string_view method,
                    std::string_view target, Clock::time_point started);
  asio::awaitable<void> lingering_close();
  /// Whether a new cleartext connection whose first bytes `buffer` holds starts with the HTTP/2
  /// client preface (SPEC C49), reading more while they are a beginning of it.
  asio::awaitable<bool> starts_h2(beast::flat_buffer& buffer);
  /// Sets request_id_ and trace_id_ for the request whose header is `fields` (nullptr: the
  /// header could not be parsed) and makes its id field agree (apply_request_id): a generated
  /// id's field goes to added_.
  void take_ids(bhttp::fields* fields, const RequestId& ids);

  Stream stream_;
  std::shared_ptr<SessionContext> context_;
  std::string client_ip_;
  State state_ = State::idle;
  bool close_after_response_ = false;
  bool reject_pending_input_ = false;  ///< a rejected request's rest may still be arriving
  /// The current request's id and trace id ("" when none); their capacity is reused.
  std::string request_id_;
  std::string trace_id_;
  /// The fields the gateway adds to the current request (a generated id, the forwarding
  /// fields), as lines: the relay renders them after the request's own; a held request gets
  /// them as fields (serve_held).
  AddedFields added_;
  /// Set while the connection speaks HTTP/2 (C49).
  std::unique_ptr<H2Connection> h2_;
  /// The current request's parsers, built in place for each request: kept out of the
  /// coroutine frames, which then stay small enough for glibc's per-thread cache.
  std::optional<HeldParser> held_parser_;
  std::optional<StreamRequestParser> streamed_parser_;
};

template <class Stream>
template <class... Args>
BasicSession<Stream>::BasicSession(std::shared_ptr<SessionContext> context, Args&&... stream_args)
    : stream_(std::forward<Args>(stream_args)...), context_(std::move(context)) {
  boost::system::error_code ec;
  const auto remote = lowest().socket().remote_endpoint(ec);
  client_ip_ = ec ? std::string("unknown") : remote.address().to_string();
  context_->sessions.insert(this);
  if (context_->observers.connection_opened) context_->observers.connection_opened();
}

template <class Stream>
BasicSession<Stream>::~BasicSession() {
  context_->sessions.erase(this);
  if (context_->observers.connection_closed) context_->observers.connection_closed();
  if (context_->gate) context_->gate->give_back();
  if (context_->on_session_end) context_->on_session_end();
}

template <class Stream>
void BasicSession<Stream>::drain() {
  if (h2_) {
    h2_->drain();
    return;
  }
  close_after_response_ = true;
  if (state_ == State::idle) {
    // Cancelled, not closed: a read that already completed with a request's bytes (its handler
    // queued behind this one) is then served and answered with Connection: close, where a
    // closed socket would have let it run with nowhere to write its answer. A read still
    // waiting ends with operation_aborted and the connection closes unread (C45).
    boost::system::error_code ignored;
    lowest().socket().cancel(ignored);
  }
}

template <class Stream>
void BasicSession<Stream>::close() {
  if (h2_) h2_->close();
  lowest().close();
}

template <class Stream>
asio::awaitable<void> BasicSession<Stream>::run() {
  // Bounded: chunk extensions and trailer fields must fit in it along with the header section
  // (Beast holds a whole chunk-size line or trailer section in the buffer before parsing it).
  beast::flat_buffer buffer{read_buffer_bytes(context_->config()->limits)};
  bool first = true;
  if constexpr (kTls) {
    lowest().expires_after(context_->config()->limits.header_read_timeout);
    auto [ec] = co_await stream_.async_handshake(asio::ssl::stream_base::server, use_nothrow);
    if (ec) {
      log_json(spdlog::level::debug, "TLS handshake failed",
               {{"client", client_ip_}, {"error", ec.message()}});
      lowest().close();
      co_return;
    }
    // ALPN chose HTTP/2 (C49): the connection is served by the HTTP/2 codec.
    const unsigned char* alpn = nullptr;
    unsigned int alpn_size = 0;
    SSL_get0_alpn_selected(stream_.native_handle(), &alpn, &alpn_size);
    if (std::string_view(reinterpret_cast<const char*>(alpn), alpn_size) == "h2") {
      h2_ = std::make_unique<H2Connection>(ByteStream(stream_), context_, client_ip_, "https");
      co_await h2_->run(buffer);
      lowest().close();
      co_return;
    }
  }
  for (;;) {
    if (buffer.size() == 0) {
      if (context_->draining) break;
      state_ = State::idle;
      // C07: a new connection gets header_read_timeout for its first byte, a kept-alive one
      // idle_timeout between requests.
      const auto& limits = context_->config()->limits;
      const auto [ec, n] = co_await read_some_by(
          buffer, Clock::now() + (first ? limits.header_read_timeout : limits.idle_timeout));
      if (ec) break;
    }
    bool h2 = false;
    if constexpr (!kTls) {
      // (co_await kept out of a condition: GCC 12 fails on it there.)
      if (first && context_->config()->listen.h2c) h2 = co_await starts_h2(buffer);
    }
    if (h2) {
      h2_ = std::make_unique<H2Connection>(ByteStream(lowest()), context_, client_ip_, "http");
      co_await h2_->run(buffer);
      break;
    }
    first = false;
    state_ = State::busy;
    // The snapshot current when the request begins (a reload applies to new requests).
    auto config = context_->config();
    const auto began = Clock::now();
    const auto header_limit = header_limit_of(config->limits);
    bool keep_alive = false;
    if (header_section_complete(buffer, header_limit) ||
        co_await complete_header(buffer, header_limit,
                                 began + config->limits.header_read_timeout)) {
      keep_alive = co_await serve_one(buffer, std::move(config), began);
    }
    if (!keep_alive) {
      // Input may still be on its way after a rejected request or behind a last pipelined one.
      if (reject_pending_input_ || buffer.size() > 0) co_await lingering_close();
      break;
    }
  }
  lowest().close();
}

template <class Stream>
asio::awaitable<std::tuple<boost::system::error_code, std::size_t>>
BasicSession<Stream>::read_some_by(beast::flat_buffer& buffer, Clock::time_point deadline) {
  if constexpr (!kTls) {
    if (context_->header_deadlines) {
      // A keep-alive connection waits for its next request in the thread's deadline list: no
      // timer is armed and cancelled around every read (C07).
      auto& socket = lowest().socket();
      lowest().expires_never();
      SlowHeader waiting(socket, deadline);
      HeaderDeadlines::Guard guard(*context_->header_deadlines, waiting);
      auto [ec, n] = co_await socket.async_read_some(read_room(buffer), use_nothrow);
      co_return std::tuple{read_by_entry_ended(socket, buffer, ec, n), n};
    }
  }
  lowest().expires_at(deadline);
  auto [ec, n] = co_await stream_.async_read_some(read_room(buffer), use_nothrow);
  buffer.commit(n);
  co_return std::tuple{ec, n};
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::starts_h2(beast::flat_buffer& buffer) {
  // Within the deadline of the first byte (header_read_timeout), already set.
  for (;;) {
    const std::string_view seen(static_cast<const char*>(buffer.data().data()), buffer.size());
    switch (match_h2_preface(seen)) {
      case PrefaceMatch::http1:
        co_return false;
      case PrefaceMatch::h2:
        co_return true;
      case PrefaceMatch::more:
        break;
    }
    auto [ec, n] = co_await stream_.async_read_some(read_room(buffer), use_nothrow);
    if (ec) co_return false;  // the HTTP/1.1 path ends the connection
    buffer.commit(n);
  }
}

template <class Stream>
void BasicSession<Stream>::take_ids(bhttp::fields* fields, const RequestId& ids) {
  added_.clear();
  if (fields == nullptr) {
    bhttp::fields none;
    apply_request_id(none, ids, request_id_);
    trace_id_.clear();
    return;
  }
  apply_request_id(*fields, ids, request_id_, added_);
  trace_id_.assign(request_trace_id(*fields));
}

template <class Stream>
asio::awaitable<void> BasicSession<Stream>::lingering_close() {
  // On the TCP layer for TLS too: what still arrives is discarded unread, so its records need
  // no decryption, and the response is complete by its framing without a close_notify.
  boost::system::error_code ec;
  lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) co_return;
  lowest().expires_after(kLingerTime);
  std::size_t discarded = 0;
  char scratch[kReadChunk];
  while (discarded < kLingerMaxBytes) {
    auto [rec, n] = co_await lowest().async_read_some(asio::buffer(scratch), use_nothrow);
    if (rec) break;
    discarded += n;
  }
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::complete_header(beast::flat_buffer& buffer,
                                                            std::uint32_t header_limit,
                                                            Clock::time_point deadline) {
  lowest().expires_at(deadline);
  // A header that needs more reads (a slow client, slowloris: C54) is read from the socket under
  // the thread's deadline list rather than Beast's per-operation timer: a byte then costs no
  // timer operation. (A readiness wait would cost an epoll_ctl per byte: Asio re-arms the
  // descriptor for every operation that is not tried at once.)
  SlowHeader slow_header(lowest().socket(), deadline);
  std::optional<HeaderDeadlines::Guard> slow_header_guard;
  do {
    if constexpr (!kTls) {
      if (context_->header_deadlines) {
        auto& socket = lowest().socket();
        if (!slow_header_guard) {
          lowest().expires_never();
          slow_header_guard.emplace(*context_->header_deadlines, slow_header);
        }
        auto [rec, rn] = co_await socket.async_read_some(read_room(buffer), use_nothrow);
        // EOF, reset, or closed at its deadline or by a drain.
        if (read_by_entry_ended(socket, buffer, rec, rn)) co_return false;
        continue;
      }
    }
    auto [rec, rn] = co_await stream_.async_read_some(read_room(buffer), use_nothrow);
    if (rec) co_return false;  // EOF, reset or timeout before a whole header: end silently
    buffer.commit(rn);
  } while (!header_section_complete(buffer, header_limit));
  co_return true;
}

template <class Stream>
std::optional<Rejection> BasicSession<Stream>::parse_head(beast::flat_buffer& buffer,
                                                          HeldParser& parser,
                                                          const Limits& limits) {
  if (has_obs_fold({static_cast<const char*>(buffer.data().data()), buffer.size()})) {
    return obs_fold_rejection();
  }
  // The section is whole in `buffer` (header_section_complete), or one the parser refuses: the
  // parser never needs more here.
  const auto ec = put_header(buffer, parser).value_or(bhttp::error::need_more);
  if (ec) return rejection_for(ec, limits);
  return check_request_head(parser.get().base(), parser.chunked());
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::send_continue(const Limits& limits) {
  bhttp::response<bhttp::empty_body> interim{bhttp::status::continue_, 11};
  lowest().expires_after(limits.idle_timeout);
  auto [ec, n] = co_await bhttp::async_write(stream_, interim, use_nothrow);
  co_return !ec;
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::read_held_body(beast::flat_buffer& buffer,
                                                           HeldParser& parser, const Limits& limits,
                                                           std::optional<Rejection>& reject) {
  // A held body (C04): a declared length over the limit is refused before any body byte.
  parser.body_limit(static_cast<std::uint64_t>(limits.max_request_body));
  if (const auto length = parser.content_length(); length && *length > limits.max_request_body) {
    reject = rejection_for(bhttp::error::body_limit, limits);
    co_return true;
  }
  if (parser.get().version() >= 11 &&
      beast::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
    if (!co_await send_continue(limits)) co_return false;
  }
  // Trailer fields would be merged into the header: keep the header as it arrived.
  std::optional<bhttp::request_header<>> header;
  if (parser.chunked()) header = parser.get().base();
  // Each read must progress within idle_timeout; a slow but steady upload is not cut (C07).
  const auto ec = co_await async_read_body(stream_, buffer, parser, limits.idle_timeout);
  if (ec) {
    reject = body_rejection(ec, limits);
    co_return reject.has_value();
  }
  if (header) parser.get().base() = std::move(*header);
  co_return true;
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::write_answer(HandlerResult& result, const Route* route,
                                                         std::string_view origin,
                                                         const ProxyConfig& config,
                                                         unsigned version, bool head,
                                                         bool& keep_alive) {
  const auto& limits = config.limits;
  Response& res = result.response;
  if (route && !result.route_fields_set) {
    context_->handler->add_route_fields(*route, origin, res.base());
  }
  finalize_response(res, version, keep_alive, head, config.request_id, request_id_);
  // Written piece by piece, each within idle_timeout: a client that reads a large held answer
  // slowly but steadily gets all of it (C07); one that stops reading is cut.
  boost::system::error_code wec;
  if (result.tail) {
    // A held request's answer whose body was not held (C39): it follows as it arrives.
    const TailOutcome sent =
        co_await send_tail(ByteStream(stream_), res.base(), *result.tail, limits);
    if (!sent.written) wec = asio::error::connection_aborted;
    keep_alive = keep_alive && sent.keep_alive;
    if (!sent.cut.empty()) {
      log_json(spdlog::level::warn, "stream cut",
               {{"route", route ? route->name : std::string()},
                {"detail", sent.cut},
                {"request_id", request_id_}});
    }
  } else {
    // finalize_response left no body for HEAD, 1xx, 204 and 304.
    wec =
        co_await write_response(ByteStream(stream_), res.base(), asio::buffer(res.body()), limits);
  }
  if (wec) keep_alive = false;
  co_return !wec;
}

template <class Stream>
void BasicSession<Stream>::log_done(const Done& done, Clock::time_point started) {
  const auto [started_wall, total] = times_of(started);
  const std::string_view route = done.route ? std::string_view(done.route->name) : "";
  log_access(started_wall, route, done.method, done.target, done.status, done.outcome,
             done.key_hash, to_ms(done.upstream_time), to_ms(total), client_ip_, done.written,
             request_id_, trace_id_, done.ended);
  if (context_->observers.request_done) {
    context_->observers.request_done(route, done.outcome, done.upstream_time);
  }
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::serve_one(beast::flat_buffer& buffer,
                                                      std::shared_ptr<const ProxyConfig> config,
                                                      Clock::time_point started) {
  const auto& limits = config->limits;
  HeldParser& parser = held_parser_.emplace();
  parser.header_limit(header_limit_of(limits));
  // The body limit depends on the route: max_request_body for a request the handler holds,
  // max_streamed_body for a streamed one (C04, C38). It is set once the header is routed.
  parser.body_limit(boost::none);
  check_chunk_extensions(parser);  // RFC 9112 §7.1.1, C03

  // A request the gateway refuses itself (C03, C04); the connection closes after the answer.
  std::optional<Rejection> reject = parse_head(buffer, parser, limits);
  const bool parsed = parser.is_header_done();
  const unsigned version = parsed ? parser.get().version() : 11;
  // Before anything is answered: every answer, the gateway's own included, carries the id.
  take_ids(parsed ? &parser.get() : nullptr, config->request_id);
  // For the handler's fields on every answer of the route (add_route_fields, C57).
  const std::string origin(parsed ? parser.get()[bhttp::field::origin] : "");

  // Routed by the header alone; what the handler does not need whole is streamed (C38, C40).
  const Route* route = nullptr;
  auto upstream = config->upstreams.end();
  // The request's place in its route's max_in_flight, held until it is answered (C53).
  Admission::Ticket in_flight;
  bool shed = false;
  bool shed_unread_body = false;  // shed before its body was read: the rest is not read
  if (!reject) {
    const auto& hdr = parser.get();
    const std::string_view t(hdr.target().data(), hdr.target().size());
    route = match(*config, hdr[bhttp::field::host], target_path(t), hdr.method_string());
    if (route) upstream = config->upstreams.find(route->upstream);
    if (route && context_->admission) {
      in_flight = context_->admission->enter(*route);
      shed = !in_flight;
    }
    if (upstream != config->upstreams.end() && context_->handler->streaming_pool() &&
        !context_->handler->holds(*route, hdr)) {
      const auto length = parser.content_length();
      if (shed) {
        shed_unread_body = !parser.is_done();  // the body may be of any length
      } else if (limits.max_streamed_body > 0 && length && *length > limits.max_streamed_body) {
        reject = Rejection{Problem::payload_too_large,
                           "the request body (" + std::to_string(*length) +
                               " bytes) exceeds max_streamed_body (" +
                               std::to_string(limits.max_streamed_body) + " bytes)"};
      } else {
        co_return co_await stream_one(buffer, parser, *config, *route, upstream->second, started,
                                      origin);
      }
    }
  }
  if (shed && !parser.is_done() &&
      beast::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
    shed_unread_body = true;  // the client waits to be asked for the body: it is not
  }
  if (!reject && !shed_unread_body && !parser.is_done()) {
    if (!co_await read_held_body(buffer, parser, limits, reject)) co_return false;
  }
  co_return co_await serve_held(parser, config, route, in_flight, shed, shed_unread_body, reject,
                                version, origin, started);
}

template <class Stream>
asio::awaitable<HandlerResult> BasicSession<Stream>::answer_held(
    Request request, const std::shared_ptr<const ProxyConfig>& config, const Route* route,
    Admission::Ticket& in_flight, bool shed, bool shed_unread_body,
    std::optional<Rejection>& reject, unsigned version, bool asked_keep_alive, bool& keep_alive) {
  if (reject) {
    reject_pending_input_ = true;
    HandlerResult result;
    result.response = make_problem(reject->problem, std::move(reject->detail), version, false);
    result.outcome = "rejected";
    return answer_now(std::move(result));
  }
  keep_alive = asked_keep_alive && !close_after_response_ && !context_->draining;
  if (shed_unread_body) {
    // The rest of the body is still on its way: discarded by the lingering close.
    keep_alive = false;
    reject_pending_input_ = true;
  }
  RoutedRequest routed{std::move(request),      config,     route,
                       std::move(in_flight),    shed,       client_ip_,
                       kTls ? "https" : "http", request_id_};
  routed.added = &added_;
  return answer_routed(*context_->handler, std::move(routed), version, keep_alive);
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::serve_held(
    HeldParser& parser, const std::shared_ptr<const ProxyConfig>& config, const Route* route,
    Admission::Ticket& in_flight, bool shed, bool shed_unread_body,
    std::optional<Rejection>& reject, unsigned version, std::string_view origin,
    Clock::time_point started) {
  // Beast's parser reads every Connection field line; the message's keep_alive() only the first.
  const bool asked_keep_alive = !reject && parser.is_header_done() && parser.keep_alive();
  const bool routed = !reject;
  const std::string method(parser.get().method_string());
  const std::string target(parser.get().target());
  const bool head = parser.get().method() == bhttp::verb::head;
  bool keep_alive = false;
  auto answer = answer_held(parser.release(), config, route, in_flight, shed, shed_unread_body,
                            reject, version, asked_keep_alive, keep_alive);
  HandlerResult result = co_await std::move(answer);
  if (routed) {
    // A drain or a close decided while the handler worked ends the connection after the answer.
    keep_alive = keep_alive && !close_after_response_ && !context_->draining;
  }
  const bool written =
      co_await write_answer(result, route, origin, *config, version, head, keep_alive);
  log_done({route, method, target, result.response.result_int(), result.outcome, result.key_hash,
            result.upstream_time, written, ""},
           started);
  co_return keep_alive;
}

template <class Stream>
asio::awaitable<bool> BasicSession<Stream>::stream_one(
    beast::flat_buffer& buffer, HeldParser& parser, const ProxyConfig& config, const Route& route,
    const Upstream& upstream, Clock::time_point started, std::string_view origin) {
  const auto& limits = config.limits;
  auto& header = parser.get();
  const unsigned version = header.version();
  const bool head = header.method() == bhttp::verb::head;
  const std::string method(header.method_string());
  const std::string target(header.target());
  const bool client_keep_alive =
      parser.keep_alive() && !close_after_response_ && !context_->draining;
  const bool websocket =
      std::find(route.upgrade.begin(), route.upgrade.end(), "websocket") != route.upgrade.end() &&
      beast::websocket::is_upgrade(header);
  if (!parser.is_done() && version >= 11 &&
      beast::iequals(header[bhttp::field::expect], "100-continue")) {
    if (!co_await send_continue(limits)) co_return false;
  }
  prepare_forwarded(header, client_ip_, kTls ? "https" : "http", added_);
  context_->handler->strip_owned_fields(header);
  // A list of equal lengths ("3, 3", or the field twice) is one length to the parser (RFC 9110
  // §8.6) but not to every upstream: it goes out as the one value it stands for (C03).
  if (const auto length = parser.content_length()) set_content_length(header, *length);

  StreamRequestParser& streamed = streamed_parser_.emplace(std::move(parser));
  streamed.on_chunk_header(chunk_extension_check);  // RFC 9112 §7.1.1, C03
  // No configured limit is 2^63-1 bytes: a chunk size beyond it is no body anyone sends.
  streamed.body_limit(limits.max_streamed_body > 0
                          ? static_cast<std::uint64_t>(limits.max_streamed_body)
                          : static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  // A tunnel's place among max_tunnels, from the upgrade request to the tunnel's end (C52).
  Admission::Ticket tunnel;
  if (websocket && context_->admission)
    tunnel = context_->admission->open_tunnel(limits.max_tunnels);
  RelayOutcome outcome;
  if (websocket && context_->admission && !tunnel) {
    outcome.keep_alive = client_keep_alive && streamed.is_done();
    outcome.outcome = "shed";
    outcome.problem = shed_response(std::to_string(limits.max_tunnels) +
                                        " tunnels are open (max_tunnels); the upgrade was not "
                                        "forwarded, retry later",
                                    version, outcome.keep_alive);
  } else {
    RelayRequest request{ByteStream(stream_)};
    request.client_buffer = &buffer;
    request.parser = &streamed;
    request.client_version = version;
    request.client_keep_alive = client_keep_alive;
    request.head = head;
    request.websocket = websocket;
    request.limits = &limits;
    request.upstream = &upstream;
    request.pool = context_->handler->streaming_pool();
    request.deadlines = context_->header_deadlines.get();
    request.handler = context_->handler;
    request.route = &route;
    request.origin = origin;
    request.tunnel_observer = context_->observers.tunnel;
    request.added = &added_;
    request.request_id_header = config.request_id.header;
    request.request_id = request_id_;
    co_await relay(request, outcome);
  }
  // A client body that breaks its framing (C03) or passes max_streamed_body (C38) before any
  // response byte: the upstream's connection is already gone (the exchange is cut); the client
  // gets 400 or 413 and its connection closes.
  if (outcome.request_error && outcome.status == 0 && !outcome.problem) {
    if (auto rejection = body_rejection(outcome.request_error, limits)) {
      if (outcome.request_error == bhttp::error::body_limit) {
        rejection->detail = "the request body exceeds max_streamed_body (" +
                            std::to_string(limits.max_streamed_body) + " bytes)";
      }
      outcome.problem =
          make_problem(rejection->problem, std::move(rejection->detail), version, false);
      outcome.keep_alive = false;
      outcome.outcome = "rejected";
    }
  }
  if (outcome.problem) {
    co_await write_problem(outcome, config, route, upstream, origin, version, head);
  }
  // The rest of a body the upstream never took (or answered early, C47) may still be arriving.
  if (!streamed.is_done()) reject_pending_input_ = true;
  log_streamed(outcome, route, method, target, started);
  co_return outcome.keep_alive && !close_after_response_ && !context_->draining;
}

template <class Stream>
asio::awaitable<void> BasicSession<Stream>::write_problem(
    RelayOutcome& outcome, const ProxyConfig& config, const Route& route, const Upstream& upstream,
    std::string_view origin, unsigned version, bool head) {
  HandlerResult answer;
  answer.response = std::move(*outcome.problem);
  outcome.written =
      co_await write_answer(answer, &route, origin, config, version, head, outcome.keep_alive);
  outcome.status = answer.response.result_int();
  if (outcome.outcome == "upstream_error") {
    log_json(spdlog::level::warn, "upstream failed",
             {{"route", route.name},
              {"upstream", upstream.name},
              {"detail", answer.response.body()},
              {"request_id", request_id_}});
  }
}

template <class Stream>
void BasicSession<Stream>::log_streamed(const RelayOutcome& outcome, const Route& route,
                                        std::string_view method, std::string_view target,
                                        Clock::time_point started) {
  const std::string_view ended = outcome.client_closed ? "client_closed" : "";
  if (!outcome.cut.empty()) {
    log_json(spdlog::level::warn, outcome.tunnel ? "tunnel cut" : "stream cut",
             {{"route", route.name},
              {"method", method},
              {"target", target},
              {"client", client_ip_},
              {"detail", outcome.cut},
              {"request_id", request_id_}});
  }
  if (!outcome.tunnel) {
    log_done({&route, method, target, outcome.status, outcome.outcome, "", outcome.upstream_time,
              outcome.written, ended},
             started);
    return;
  }
  // A tunnel's line carries what it moved (C40).
  const auto [started_wall, total] = times_of(started);
  boost::json::object line{{"time", format_rfc3339(started_wall)},
                           {"route", route.name},
                           {"method", method},
                           {"target", target},
                           {"status", outcome.status},
                           {"outcome", outcome.outcome},
                           {"key_hash", ""},
                           {"upstream_ms", to_ms(outcome.upstream_time)},
                           {"total_ms", to_ms(total)},
                           {"client", client_ip_},
                           {"written", outcome.written},
                           {"request_id", request_id_},
                           {"trace_id", trace_id_},
                           {"bytes_in", outcome.bytes_in},
                           {"bytes_out", outcome.bytes_out}};
  if (!ended.empty()) line["ended"] = ended;
  log_json(spdlog::level::info, "access", std::move(line));
  if (context_->observers.request_done) {
    context_->observers.request_done(route.name, outcome.outcome, outcome.upstream_time);
  }
}

template <class Session>
asio::awaitable<void> serve(std::unique_ptr<Session> session) {
  co_await session->run();
}

}  // namespace

void start_session(tcp::socket socket, std::shared_ptr<SessionContext> context) {
  auto executor = socket.get_executor();
  const auto on_end = common::log_on_exception("session failed");
  if (context->tls) {
    auto& tls = *context->tls;
    asio::co_spawn(executor,
                   serve(std::make_unique<BasicSession<TlsStream>>(
                       std::move(context), beast::tcp_stream(std::move(socket)), tls)),
                   on_end);
  } else {
    asio::co_spawn(executor,
                   serve(std::make_unique<BasicSession<beast::tcp_stream>>(std::move(context),
                                                                           std::move(socket))),
                   on_end);
  }
}

}  // namespace idemgate::http
