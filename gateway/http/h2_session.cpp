#include "gateway/http/h2_session.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/answer.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/relay.hpp"
#include "gateway/http/request_id.hpp"
#include "gateway/http/request_rules.hpp"
#include "gateway/http/router.hpp"
#include "gateway/http/session.hpp"
#include "gateway/http/traceparent.hpp"
#include "gateway/http/upstream_pool.hpp"

namespace idemgate::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using common::use_nothrow;
using Clock = std::chrono::steady_clock;
using tcp = asio::ip::tcp;

PrefaceMatch match_h2_preface(std::string_view first_bytes) {
  const std::size_t n = std::min(first_bytes.size(), kH2Preface.size());
  if (first_bytes.substr(0, n) != kH2Preface.substr(0, n)) return PrefaceMatch::http1;
  return n == kH2Preface.size() ? PrefaceMatch::h2 : PrefaceMatch::more;
}

namespace {

constexpr std::size_t kReadSize = 16 * 1024;
// Bounds of SPEC C51 (conf/REFERENCE.md, "HTTP/2"): frames that cost work without carrying a
// request (PING, SETTINGS, PRIORITY, RST_STREAM, empty DATA) are paid from a per-connection
// budget of kFloodBurst that refills at kFloodRate a second; a header list that decodes to more
// than kHeaderBombFactor × max_header_bytes ends the connection. Both with GOAWAY
// ENHANCE_YOUR_CALM.
constexpr double kFloodBurst = 1000;
constexpr double kFloodRate = 100;
constexpr std::size_t kHeaderBombFactor = 4;
constexpr std::int32_t kSmallWindowUpdate = 1024;
// Bytes read with nothing to show for them (no request header or body byte received, no answer
// byte sent): frames of types the codec skips unseen, or any other filler.
constexpr std::size_t kFillerBytes = 1024 * 1024;
// Request bodies (C50, C51): a stream's body gets flow-control window beyond the initial
// kStreamWindow only once the stream is admitted, oldest first, while the admitted streams'
// bodies (their Content-Length, else max_request_body) fit in kHeldBodiesFactor ×
// max_request_body; one stream is always admitted, so uploads never wait on each other for
// ever. A client that uploads on every stream at once is slowed instead of growing memory.
constexpr std::size_t kHeldBodiesFactor = 4;
constexpr std::uint32_t kStreamWindow = 16 * 1024;
constexpr std::size_t kWriteBatch = 64 * 1024;

/// One request stream: what the client sent, then what it gets.
struct H2Stream {
  std::int32_t id = 0;
  Clock::time_point started;
  std::shared_ptr<const config::Config> config;
  Request request;
  std::string method;
  std::string path;
  std::string authority;
  std::string cookie;  ///< `cookie` fields joined (RFC 9113 §8.2.3)
  std::size_t header_bytes = 0;
  bool header_too_large = false;
  Clock::time_point last_progress;  ///< the last time its request's header or body moved
  bool admitted = false;            ///< its body gets window (see kHeldBodiesFactor)
  bool waiting = false;             ///< in the connection's queue of bodies to admit
  std::size_t reserved = 0;         ///< bytes reserved for its body while admitted
  std::size_t window_owed = 0;      ///< DATA received before admission, window not given back
  bool body_too_large = false;
  bool framed = false;     ///< DATA frames or a content-length came: the body is framed
  bool answering = false;  ///< the request is whole (or refused): its answer is under way
  bool submitted = false;  ///< the response header went to the codec
  bool closed = false;     ///< the codec closed the stream (done, or reset by either side)
  std::uint32_t close_error = 0;
  // The response body: held whole, or a ResponseTail's next piece (C39).
  std::string out;
  std::size_t out_sent = 0;
  bool out_eof = true;
  bool deferred = false;  ///< the codec waits for more of `out`
  std::optional<asio::steady_timer> pump_wake;
  // The access line (C32), written once the stream has ended.
  bool logged = false;
  const config::Route* route = nullptr;
  unsigned status = 0;
  std::string outcome;
  std::string key_hash;
  std::string request_id;
  std::string trace_id;
  std::chrono::microseconds upstream_time{0};
  std::string cut;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

nghttp2_nv make_nv(const std::string& name, std::string_view value) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
          value.size(), NGHTTP2_NV_FLAG_NONE};
}

}  // namespace

struct H2Connection::Impl : std::enable_shared_from_this<H2Connection::Impl> {
  Impl(ByteStream s, std::shared_ptr<SessionContext> c, std::string ip, std::string_view p)
      : stream(s),
        context(std::move(c)),
        client_ip(std::move(ip)),
        proto(p),
        write_wake(s.get_executor()),
        idle_timer(s.get_executor()),
        done_wake(s.get_executor()) {}

  ~Impl() {
    if (session) nghttp2_session_del(session);
  }

  ByteStream stream;
  std::shared_ptr<SessionContext> context;
  std::string client_ip;
  std::string proto;
  std::shared_ptr<const config::Config> config;  ///< the snapshot the connection began on
  nghttp2_session* session = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<H2Stream>> streams;
  asio::steady_timer write_wake;
  asio::steady_timer idle_timer;
  asio::steady_timer done_wake;
  std::string write_buffer;
  bool writing = false;       ///< a write is on the socket
  bool writer_waits = false;  ///< the writer waits on write_wake
  bool writer_done = false;
  bool failed = false;       ///< the socket failed or was closed: nothing more is sent
  bool ending = false;       ///< the reader has ended
  bool said_goaway = false;  ///< an idle connection was told GOAWAY
  bool calm = false;         ///< a C51 bound was passed: GOAWAY, then the connection ends
  double flood_tokens = kFloodBurst;
  std::size_t filler_bytes = 0;  ///< read since the last useful frame (kFillerBytes)
  Clock::time_point flood_refilled = Clock::now();
  Clock::time_point last_write = Clock::now();  ///< the last time a write made progress
  std::size_t handlers = 0;                     ///< stream tasks still running
  /// Bytes reserved by admitted request bodies, and the streams whose bodies wait for
  /// admission, oldest first.
  std::size_t admitted_bytes = 0;
  std::deque<std::shared_ptr<H2Stream>> body_queue;
  Clock::time_point last_activity = Clock::now();

  tcp::socket& socket() { return stream.tcp().socket(); }
  const config::Limits& limits() const { return config->limits; }

  static Impl& of(void* user_data) { return *static_cast<Impl*>(user_data); }

  H2Stream* stream_of(std::int32_t id) {
    return static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, id));
  }

  bool open();
  asio::awaitable<void> run(beast::flat_buffer& buffer);
  bool receive(const void* data, std::size_t size);
  void signal_write();
  // Each task holds the connection's state (`keep`): when the io_context is destroyed with
  // tasks pending, their frames may go in any order.
  asio::awaitable<void> write_loop(std::shared_ptr<Impl> keep);
  asio::awaitable<void> watch_idle(std::shared_ptr<Impl> keep);
  void shut();
  /// Admits waiting bodies, oldest first, while they fit (kHeldBodiesFactor).
  void admit();
  /// The body `s` reserved is free again (its handler ended, or it was reset first).
  void release(H2Stream& s);
  /// Ends the connection for passing a C51 bound: GOAWAY ENHANCE_YOUR_CALM, nothing more read.
  void enhance_your_calm(std::string_view reason, std::string_view why);
  /// Pays one frame that carries no request from the flood budget; false once it is spent.
  bool pay_flood();
  void start(H2Stream& s);
  asio::awaitable<void> serve(std::shared_ptr<Impl> keep, std::shared_ptr<H2Stream> s);
  asio::awaitable<void> pump(std::shared_ptr<H2Stream> s, std::shared_ptr<ResponseTail> tail);
  void submit(H2Stream& s, Response& res, bool head, bool streamed);
  void log_done(H2Stream& s);

  // nghttp2 callbacks
  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user_data);
  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
                       std::size_t namelen, const std::uint8_t* value, std::size_t valuelen,
                       std::uint8_t flags, void* user_data);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user_data);
  static int on_data_chunk(nghttp2_session*, std::uint8_t flags, std::int32_t stream_id,
                           const std::uint8_t* data, std::size_t len, void* user_data);
  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code,
                             void* user_data);
  static ssize_t read_body(nghttp2_session*, std::int32_t stream_id, std::uint8_t* buf,
                           std::size_t length, std::uint32_t* data_flags,
                           nghttp2_data_source* source, void* user_data);
};

bool H2Connection::Impl::open() {
  config = context->config();
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) return false;
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, &on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &on_stream_close);
  nghttp2_option* option = nullptr;
  if (nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(callbacks);
    return false;
  }
  // A SETTINGS frame with more entries than this ends the connection (CVE-2019-9515 sends many).
  nghttp2_option_set_max_settings(option, 32);
  // Flow control is ours: DATA is given back to the window once its memory is free (release()).
  nghttp2_option_set_no_auto_window_update(option, 1);
  const int rv = nghttp2_session_server_new2(&session, callbacks, this, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) {
    session = nullptr;
    return false;
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
       static_cast<std::uint32_t>(limits().h2_max_concurrent_streams)},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
       static_cast<std::uint32_t>(std::min<std::size_t>(limits().max_header_bytes, UINT32_MAX))},
  };
  return nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, std::size(settings)) == 0;
}

int H2Connection::Impl::on_begin_headers(nghttp2_session* session, const nghttp2_frame* frame,
                                         void* user_data) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  Impl& self = of(user_data);
  // Rapid Reset (CVE-2023-44487): a client keeps within MAX_CONCURRENT_STREAMS by resetting the
  // streams it opened while their work goes on; more running than it may have open is that.
  // A client that cancels a stream may open another at once while the first one's handler
  // winds down: twice the limit leaves it that much room.
  if (self.handlers >= 2 * self.limits().h2_max_concurrent_streams) {
    self.enhance_your_calm("rapid_reset",
                           "more streams in progress than h2_max_concurrent_streams (reset early)");
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  auto s = std::make_shared<H2Stream>();
  s->id = frame->hd.stream_id;
  s->started = Clock::now();
  s->last_progress = s->started;
  s->config = self.context->config();
  s->request.version(11);
  nghttp2_session_set_stream_user_data(session, s->id, s.get());
  self.streams.emplace(s->id, std::move(s));
  return 0;
}

int H2Connection::Impl::on_header(nghttp2_session*, const nghttp2_frame* frame,
                                  const std::uint8_t* name, std::size_t namelen,
                                  const std::uint8_t* value, std::size_t valuelen, std::uint8_t,
                                  void* user_data) {
  Impl& self = of(user_data);
  H2Stream* s = self.stream_of(frame->hd.stream_id);
  // Trailer fields are not forwarded: the header stays as it arrived (as over HTTP/1.1).
  if (!s || s->answering || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  // Counted as the field's HTTP/1.1 line (`name: value` CRLF), so that one limit means the same
  // over both protocols (C04, C50).
  s->header_bytes += namelen + valuelen + 4;
  if (s->header_bytes > s->config->limits.max_header_bytes) s->header_too_large = true;
  if (s->header_bytes > kHeaderBombFactor * s->config->limits.max_header_bytes) {
    self.enhance_your_calm("header_bomb", "a header list decoded past " +
                                              std::to_string(kHeaderBombFactor) +
                                              " x max_header_bytes (HPACK bomb)");
    return NGHTTP2_ERR_PAUSE;
  }
  if (s->header_too_large) return 0;
  if (n == ":method") {
    s->method.assign(v);
  } else if (n == ":path") {
    s->path.assign(v);
  } else if (n == ":authority") {
    s->authority.assign(v);
  } else if (n.starts_with(':')) {
    // :scheme (checked by the codec), :protocol (no extended CONNECT is offered)
  } else if (n == "cookie") {
    if (!s->cookie.empty()) s->cookie += "; ";
    s->cookie.append(v);
  } else {
    if (n == "content-length") s->framed = true;
    s->request.insert(n, v);
  }
  return 0;
}

int H2Connection::Impl::on_frame_recv(nghttp2_session*, const nghttp2_frame* frame,
                                      void* user_data) {
  Impl& self = of(user_data);
  self.last_activity = Clock::now();
  const bool costly =
      frame->hd.type == NGHTTP2_PING || frame->hd.type == NGHTTP2_PRIORITY ||
      frame->hd.type == NGHTTP2_RST_STREAM ||
      (frame->hd.type == NGHTTP2_SETTINGS && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) ||
      (frame->hd.type == NGHTTP2_DATA && frame->hd.length <= frame->data.padlen &&
       (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) ||
      // data dribble (CVE-2019-9511): windows opened a few bytes at a time
      (frame->hd.type == NGHTTP2_WINDOW_UPDATE &&
       frame->window_update.window_size_increment < kSmallWindowUpdate);
  if (costly && !self.pay_flood()) {
    self.enhance_your_calm("flood",
                           "more PING, SETTINGS, PRIORITY, RST_STREAM or empty DATA frames than " +
                               std::to_string(static_cast<int>(kFloodRate)) + " a second");
    return 0;
  }
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS) self.filler_bytes = 0;
  H2Stream* s = self.stream_of(frame->hd.stream_id);
  if (!s || s->answering) return 0;
  // A header list past the limit is answered at once (431): its body is not needed.
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 || s->header_too_large) self.start(*s);
  return 0;
}

int H2Connection::Impl::on_data_chunk(nghttp2_session* session, std::uint8_t,
                                      std::int32_t stream_id, const std::uint8_t* data,
                                      std::size_t len, void* user_data) {
  Impl& self = of(user_data);
  // The connection's window is always given back: only streams wait for theirs.
  nghttp2_session_consume_connection(session, len);
  H2Stream* s = self.stream_of(stream_id);
  if (!s || s->answering) {  // answered early: the rest is read and dropped
    nghttp2_session_consume_stream(session, stream_id, len);
    return 0;
  }
  s->framed = true;
  s->last_progress = Clock::now();
  auto& body = s->request.body();
  if (body.size() + len > s->config->limits.max_request_body) {
    s->body_too_large = true;  // C04: 413 before the body ends; nothing is forwarded
    nghttp2_session_consume_stream(session, stream_id, len);
    self.start(*s);
    return 0;
  }
  body.append(reinterpret_cast<const char*>(data), len);
  self.filler_bytes = 0;
  if (s->admitted) {
    nghttp2_session_consume_stream(session, stream_id, len);
    return 0;
  }
  s->window_owed += len;
  if (!s->waiting) {
    s->waiting = true;
    const auto it = self.streams.find(stream_id);
    if (it != self.streams.end()) self.body_queue.push_back(it->second);
  }
  self.admit();
  return 0;
}

void H2Connection::Impl::admit() {
  const std::size_t bound = kHeldBodiesFactor * std::max<std::size_t>(limits().max_request_body, 1);
  while (!body_queue.empty()) {
    H2Stream& s = *body_queue.front();
    if (s.closed || s.answering || s.admitted) {
      body_queue.pop_front();
      continue;
    }
    const auto field = s.request[bhttp::field::content_length];
    const std::string_view length(field.data(), field.size());
    std::size_t need = s.config->limits.max_request_body;
    if (!length.empty()) {
      std::size_t declared = 0;
      const auto [end, ec] =
          std::from_chars(length.data(), length.data() + length.size(), declared);
      if (ec == std::errc() && end == length.data() + length.size())
        need = std::min(need, declared);
    }
    if (admitted_bytes > 0 && admitted_bytes + need > bound) break;  // one is always admitted
    admitted_bytes += need;
    s.reserved = need;
    s.admitted = true;
    s.waiting = false;
    if (s.window_owed > 0) {
      nghttp2_session_consume_stream(session, s.id, s.window_owed);
      s.window_owed = 0;
      signal_write();
    }
    body_queue.pop_front();
  }
}

void H2Connection::Impl::release(H2Stream& s) {
  if (!s.admitted) return;
  s.admitted = false;
  admitted_bytes -= std::min(admitted_bytes, s.reserved);
  s.reserved = 0;
  admit();
}

int H2Connection::Impl::on_stream_close(nghttp2_session*, std::int32_t stream_id,
                                        std::uint32_t error_code, void* user_data) {
  Impl& self = of(user_data);
  const auto it = self.streams.find(stream_id);
  if (it == self.streams.end()) return 0;
  const std::shared_ptr<H2Stream> s = std::move(it->second);
  self.streams.erase(it);
  s->closed = true;
  s->close_error = error_code;
  if (!s->answering) self.release(*s);  // reset before its request was whole
  if (s->pump_wake) s->pump_wake->cancel();
  // A stream whose answer was submitted is logged here, when it is known whether all of it
  // went out; one still in its handler is logged when the handler returns.
  if (s->submitted) self.log_done(*s);
  return 0;
}

ssize_t H2Connection::Impl::read_body(nghttp2_session*, std::int32_t, std::uint8_t* buf,
                                      std::size_t length, std::uint32_t* data_flags,
                                      nghttp2_data_source* source, void*) {
  auto& s = *static_cast<H2Stream*>(source->ptr);
  const std::size_t available = s.out.size() - s.out_sent;
  if (available == 0 && !s.out_eof) {
    s.deferred = true;
    if (s.pump_wake) s.pump_wake->cancel();
    return NGHTTP2_ERR_DEFERRED;
  }
  const std::size_t n = std::min(length, available);
  std::memcpy(buf, s.out.data() + s.out_sent, n);
  s.out_sent += n;
  if (s.out_sent == s.out.size()) {
    if (s.out_eof) {
      *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    } else if (s.pump_wake) {
      s.pump_wake->cancel();  // room for the next piece
    }
  }
  return static_cast<ssize_t>(n);
}

void H2Connection::Impl::start(H2Stream& s) {
  s.answering = true;
  const auto it = streams.find(s.id);
  if (it == streams.end()) return;
  ++handlers;
  asio::co_spawn(stream.get_executor(), serve(shared_from_this(), it->second),
                 common::log_on_exception("HTTP/2 stream failed"));
}

asio::awaitable<void> H2Connection::Impl::serve(std::shared_ptr<Impl> keep,
                                                std::shared_ptr<H2Stream> s) {
  (void)keep;
  struct Count {
    Impl& self;
    H2Stream& stream;
    ~Count() {
      self.release(stream);  // the request and its body are gone with the handler's frame
      if (--self.handlers == 0) self.done_wake.cancel();
    }
  } count{*this, *s};
  const auto& cfg = *s->config;
  const auto& limits = cfg.limits;
  Request& req = s->request;
  req.method_string(s->method);
  req.target(s->path);
  if (!s->authority.empty()) req.set(bhttp::field::host, s->authority);
  if (!s->cookie.empty()) req.set(bhttp::field::cookie, s->cookie);
  // Before anything is answered: every answer carries the request's id (C32).
  std::string id_storage;
  s->request_id.assign(apply_request_id(req.base(), cfg.request_id, id_storage));
  s->trace_id.assign(request_trace_id(req.base()));
  const std::string origin(req[bhttp::field::origin]);
  const bool head = req.method() == bhttp::verb::head;

  std::optional<Rejection> reject;
  if (s->header_too_large) {
    reject = rejection_for(bhttp::error::header_limit, limits);
  } else if (s->body_too_large) {
    reject = rejection_for(bhttp::error::body_limit, limits);
  } else {
    if (s->framed && !req.has_content_length()) req.content_length(req.body().size());
    reject = check_request_head(req.base(), false);  // Host, absolute-form (C03)
  }
  HandlerResult result;
  if (reject) {
    result.response = make_problem(reject->problem, std::move(reject->detail), 11, true);
    result.outcome = "rejected";
  } else {
    const std::string_view t(req.target().data(), req.target().size());
    s->route = match(cfg, req[bhttp::field::host], target_path(t), req.method_string());
    Admission::Ticket in_flight;
    bool shed = false;
    if (s->route && context->admission) {
      in_flight = context->admission->enter(*s->route);
      shed = !in_flight;
    }
    bool keep_alive = true;
    // A named argument: GCC 12 destroys a braced temporary in a co_await expression twice.
    RoutedRequest routed{std::move(req), s->config, s->route,      std::move(in_flight), shed,
                         client_ip,      proto,     s->request_id, limits.stream_buffer};
    result = co_await answer_routed(*context->handler, std::move(routed), 11, keep_alive);
  }
  s->status = result.response.result_int();
  s->outcome = std::move(result.outcome);
  s->key_hash = std::move(result.key_hash);
  s->upstream_time = result.upstream_time;
  if (s->closed || failed) {
    // Reset by the client (or the connection ended) while the handler ran: C34 for a keyed
    // request, nothing to send.
    log_done(*s);
    co_return;
  }
  if (s->route && !result.route_fields_set) {
    context->handler->add_route_fields(*s->route, origin, result.response.base());
  }
  finalize_answer(result.response, head, cfg.request_id.header, s->request_id);
  const bool streamed = result.tail && !head && status_has_body(s->status);
  if (streamed) result.response.erase(bhttp::field::content_length);  // framed by END_STREAM
  submit(*s, result.response, head, streamed);
  if (streamed && !s->closed) co_await pump(s, std::move(result.tail));
  if (failed) log_done(*s);  // the connection ended under it: no stream close will come
}

void H2Connection::Impl::submit(H2Stream& s, Response& res, bool head, bool streamed) {
  std::vector<std::string> names;
  names.reserve(std::distance(res.begin(), res.end()));
  std::vector<nghttp2_nv> nva;
  nva.reserve(names.capacity() + 1);
  static const std::string status_name = ":status";
  const std::string status = std::to_string(res.result_int());
  nva.push_back(make_nv(status_name, status));
  for (const auto& field : res) {
    names.push_back(lower(field.name_string()));
    nva.push_back(make_nv(names.back(), field.value()));
  }
  const bool has_body =
      !head && status_has_body(res.result_int()) && (streamed || !res.body().empty());
  nghttp2_data_provider provider{};
  if (has_body) {
    s.out = std::move(res.body());
    s.out_sent = 0;
    s.out_eof = !streamed;
    provider.source.ptr = &s;
    provider.read_callback = &read_body;
  }
  const int rv = nghttp2_submit_response(session, s.id, nva.data(), nva.size(),
                                         has_body ? &provider : nullptr);
  if (rv != 0) {
    s.cut = std::string("submitting the response failed: ") + nghttp2_strerror(rv);
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
  }
  s.submitted = true;
  signal_write();
}

asio::awaitable<void> H2Connection::Impl::pump(std::shared_ptr<H2Stream> s,
                                               std::shared_ptr<ResponseTail> tail) {
  // A body the handler did not hold (C39): one piece of at most stream_buffer bytes at a time,
  // the next read once the codec has taken the last piece (flow control is the backpressure).
  s->pump_wake.emplace(stream.get_executor());
  const std::size_t piece = std::max<std::size_t>(s->config->limits.stream_buffer, 1024);
  while (!s->closed && !failed && !s->out_eof) {
    if (s->out_sent < s->out.size()) {
      s->pump_wake->expires_at(Clock::time_point::max());
      co_await s->pump_wake->async_wait(use_nothrow);
      continue;
    }
    s->out.resize(piece);
    std::size_t got = 0;
    bool done = false;
    const auto ec = co_await read_tail_piece(*tail, s->out.data(), piece, got, done);
    if (s->closed || failed) break;
    if (ec) {
      s->cut = "upstream " + std::string(tail->upstream_name()) +
               ": reading the response body failed: " + ec.message();
      s->out.clear();
      s->out_sent = 0;
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
      signal_write();
      break;
    }
    s->out.resize(got);
    s->out_sent = 0;
    s->out_eof = done;
    if (s->deferred) {
      s->deferred = false;
      nghttp2_session_resume_data(session, s->id);
    }
    signal_write();
  }
  s->pump_wake.reset();
}

void H2Connection::Impl::log_done(H2Stream& s) {
  if (s.logged) return;
  s.logged = true;
  if (!s.cut.empty()) {
    common::log_json(spdlog::level::warn, "stream cut",
                     {{"route", s.route ? s.route->name : std::string()},
                      {"detail", s.cut},
                      {"request_id", s.request_id}});
  }
  const auto [started_wall, total] = times_of(s.started);
  const bool written =
      s.submitted && s.closed && s.close_error == NGHTTP2_NO_ERROR && s.cut.empty();
  const std::string_view route = s.route ? std::string_view(s.route->name) : "";
  common::log_access(started_wall, route, s.method, s.path, s.status, s.outcome, s.key_hash,
                     to_ms(s.upstream_time), to_ms(total), client_ip, written, s.request_id,
                     s.trace_id, s.submitted ? "" : "client_closed", "h2");
  if (context->observers.request_done) {
    context->observers.request_done(route, s.outcome, s.upstream_time);
  }
  if (context->observers.h2_stream) context->observers.h2_stream();
}

bool H2Connection::Impl::receive(const void* data, std::size_t size) {
  const auto rv = nghttp2_session_mem_recv(session, static_cast<const std::uint8_t*>(data), size);
  if (rv < 0) {
    common::log_json(spdlog::level::debug, "HTTP/2 connection failed",
                     {{"client", client_ip}, {"error", nghttp2_strerror(static_cast<int>(rv))}});
    return false;
  }
  return true;
}

void H2Connection::Impl::signal_write() {
  if (writer_waits) write_wake.cancel();
}

asio::awaitable<void> H2Connection::Impl::write_loop(std::shared_ptr<Impl> keep) {
  (void)keep;
  while (!failed) {
    write_buffer.clear();
    while (write_buffer.size() < kWriteBatch) {
      const std::uint8_t* data = nullptr;
      const auto n = nghttp2_session_mem_send(session, &data);
      if (n < 0) {
        failed = true;
        break;
      }
      if (n == 0) break;
      write_buffer.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    }
    if (failed) break;
    if (!write_buffer.empty()) {
      writing = true;
      last_activity = Clock::now();
      auto [ec, n] = co_await asio::async_write(stream, asio::buffer(write_buffer), use_nothrow);
      writing = false;
      last_activity = Clock::now();
      last_write = last_activity;
      filler_bytes = 0;  // answers going out: what the client sends may be their windows
      if (ec) {
        failed = true;
        break;
      }
      continue;
    }
    // Nothing to send. A session that wants neither to read nor to write is over (GOAWAY sent
    // or received and no stream left): the reader is woken to end.
    if (!nghttp2_session_want_read(session) && !nghttp2_session_want_write(session)) break;
    if (ending) break;
    writer_waits = true;
    write_wake.expires_at(Clock::time_point::max());
    co_await write_wake.async_wait(use_nothrow);
    writer_waits = false;
  }
  writer_done = true;
  boost::system::error_code ignored;
  socket().cancel(ignored);  // the reader ends too
  done_wake.cancel();
}

asio::awaitable<void> H2Connection::Impl::watch_idle(std::shared_ptr<Impl> keep) {
  (void)keep;
  // C07: a connection without streams closes after idle_timeout; a write that makes no
  // progress for idle_timeout closes it too.
  const auto idle = std::chrono::duration_cast<Clock::duration>(limits().idle_timeout);
  while (!failed && !writer_done) {
    idle_timer.expires_at(last_activity + idle);
    auto [ec] = co_await idle_timer.async_wait(use_nothrow);
    if (ec || failed || writer_done) break;
    // C07 per stream: a request whose body stopped arriving for idle_timeout is reset (its
    // held bytes are freed), whatever the connection's other streams do.
    const auto now = Clock::now();
    for (const auto& [id, s] : streams) {
      if (!s->answering && now >= s->last_progress + idle) {
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        signal_write();
      }
    }
    if (Clock::now() < last_activity + idle) continue;
    if (writing || said_goaway) {
      shut();
      break;
    }
    if (handlers == 0) {
      // Idle, or streams whose requests stopped arriving (C07): GOAWAY, then the connection
      // ends once it is written (or after one more period).
      said_goaway = true;
      nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR);
      signal_write();
      last_activity = Clock::now();
      continue;
    }
    // A client that holds a zero window while answers wait to be sent (C51): nothing written
    // for idle_timeout although a stream has bytes ready.
    const bool stalled = std::any_of(streams.begin(), streams.end(), [](const auto& entry) {
      const H2Stream& s = *entry.second;
      return s.submitted && !s.closed && !s.deferred;
    });
    if (stalled && Clock::now() >= last_write + idle) {
      common::log_json(
          spdlog::level::warn, "HTTP/2 connection ended",
          {{"client", client_ip}, {"reason", "no window to send answers for idle_timeout"}});
      if (context->observers.h2_cut) context->observers.h2_cut("zero_window");
      shut();
      break;
    }
    last_activity = Clock::now();  // streams in progress: waiting on their upstreams is not idle
  }
}

bool H2Connection::Impl::pay_flood() {
  const auto now = Clock::now();
  flood_tokens = std::min(
      kFloodBurst,
      flood_tokens + kFloodRate * std::chrono::duration<double>(now - flood_refilled).count());
  flood_refilled = now;
  flood_tokens -= 1;
  return flood_tokens >= 0;
}

void H2Connection::Impl::enhance_your_calm(std::string_view reason, std::string_view why) {
  if (calm || failed) return;
  calm = true;
  common::log_json(spdlog::level::warn, "HTTP/2 connection ended",
                   {{"client", client_ip}, {"reason", why}});
  if (context->observers.h2_cut) context->observers.h2_cut(reason);
  nghttp2_session_terminate_session(session, NGHTTP2_ENHANCE_YOUR_CALM);
  signal_write();
}

void H2Connection::Impl::shut() {
  failed = true;
  boost::system::error_code ignored;
  socket().close(ignored);
  write_wake.cancel();
  idle_timer.cancel();
  done_wake.cancel();
  for (auto& [id, s] : streams) {
    if (s->pump_wake) s->pump_wake->cancel();
  }
}

asio::awaitable<void> H2Connection::Impl::run(beast::flat_buffer& buffer) {
  if (!open()) co_return;
  struct Opened {
    const SessionObservers& observers;
    explicit Opened(const SessionObservers& o) : observers(o) {
      if (observers.h2_connection) observers.h2_connection(true);
    }
    ~Opened() {
      if (observers.h2_connection) observers.h2_connection(false);
    }
  } opened{context->observers};
  stream.tcp().expires_never();  // this connection keeps its own time (watch_idle)
  const auto executor = stream.get_executor();
  asio::co_spawn(executor, write_loop(shared_from_this()),
                 common::log_on_exception("HTTP/2 writer failed"));
  asio::co_spawn(executor, watch_idle(shared_from_this()),
                 common::log_on_exception("HTTP/2 idle watch failed"));
  bool ok = receive(buffer.data().data(), buffer.size());
  buffer.consume(buffer.size());
  signal_write();
  std::vector<char> chunk(kReadSize);
  while (ok && !calm && !failed && !writer_done && nghttp2_session_want_read(session)) {
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(chunk), use_nothrow);
    if (ec) break;
    last_activity = Clock::now();
    filler_bytes += n;
    ok = receive(chunk.data(), n);
    if (ok && filler_bytes > kFillerBytes) {
      enhance_your_calm("flood", "more than 1 MiB read without a request byte in it");
    }
    signal_write();
  }
  ending = true;
  // What the codec still has to say (a GOAWAY after a protocol error) goes out first.
  signal_write();
  while (!writer_done && !failed) {
    done_wake.expires_at(Clock::time_point::max());
    co_await done_wake.async_wait(use_nothrow);
  }
  shut();
  // Handlers run to their end (C34); their answers have nowhere to go.
  while (handlers > 0) {
    done_wake.expires_at(Clock::time_point::max());
    co_await done_wake.async_wait(use_nothrow);
  }
  // Answers submitted but cut with the connection: their access lines (C32), not written.
  for (const auto& [id, s] : streams) {
    if (s->submitted) log_done(*s);
  }
}

H2Connection::H2Connection(ByteStream stream, std::shared_ptr<SessionContext> context,
                           std::string client_ip, std::string_view proto)
    : impl_(std::make_shared<Impl>(stream, std::move(context), std::move(client_ip), proto)) {}

H2Connection::~H2Connection() = default;

asio::awaitable<void> H2Connection::run(beast::flat_buffer& buffer) {
  co_await impl_->run(buffer);
}

void H2Connection::drain() {
  Impl& self = *impl_;
  if (!self.session || self.failed) return;
  nghttp2_submit_goaway(self.session, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(self.session), NGHTTP2_NO_ERROR,
                        nullptr, 0);
  self.signal_write();
}

void H2Connection::close() {
  impl_->shut();
}

}  // namespace idemgate::http
