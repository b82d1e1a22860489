#include "gateway/http/h2_session.hpp"

#include <nghttp2/nghttp2.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <charconv>
#include <chrono>
#include <exception>
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

namespace {

constexpr std::size_t kReadSize = 16 * 1024;
constexpr std::size_t kWriteBatch = 64 * 1024;

}  // namespace

struct H2Connection::Impl : H2Events, std::enable_shared_from_this<H2Connection::Impl> {
  Impl(ByteStream s, std::shared_ptr<SessionContext> c, std::string ip, std::string_view p)
      : stream(s),
        context(std::move(c)),
        client_ip(std::move(ip)),
        proto(p),
        write_wake(s.get_executor()),
        idle_timer(s.get_executor()),
        done_wake(s.get_executor()) {}

  ByteStream stream;
  std::shared_ptr<SessionContext> context;
  std::string client_ip;
  std::string proto;
  std::optional<H2Codec> codec;
  /// The timers of the streams whose answers follow in pieces (pump), by stream id.
  std::unordered_map<std::int32_t, asio::steady_timer*> pumps;
  /// The timers of the streams whose bodies go up as they arrive (H2BodySource), by stream id.
  std::unordered_map<std::int32_t, asio::steady_timer*> uploads;
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
  Clock::time_point last_write = Clock::now();  ///< the last time a write made progress
  Clock::time_point last_activity = Clock::now();

  tcp::socket& socket() { return stream.tcp().socket(); }
  const Limits& limits() const { return codec->limits(); }

  asio::awaitable<void> run(beast::flat_buffer& buffer);
  // Each task holds the connection's state (`keep`): when the io_context is destroyed with
  // tasks pending, their frames may go in any order.
  asio::awaitable<void> write_loop(std::shared_ptr<Impl> keep);
  asio::awaitable<void> watch_idle(std::shared_ptr<Impl> keep);
  void shut();
  asio::awaitable<void> serve(std::shared_ptr<Impl> keep, std::shared_ptr<H2Stream> s);
  asio::awaitable<void> pump(std::shared_ptr<H2Stream> s, std::shared_ptr<ResponseTail> tail);
  void wake_pump(const H2Stream& s) {
    const auto it = pumps.find(s.id);
    if (it != pumps.end()) it->second->cancel();
  }
  void log_done(H2Stream& s);

  // H2Events
  void request_ready(std::shared_ptr<H2Stream> s) override {
    asio::co_spawn(stream.get_executor(), serve(shared_from_this(), std::move(s)),
                   common::log_on_exception("HTTP/2 stream failed"));
  }
  void stream_closed(H2Stream& s) override {
    wake_pump(s);
    // A stream whose answer was submitted is logged here, when it is known whether all of it
    // went out; one still in its handler is logged when the handler returns.
    if (s.submitted) log_done(s);
  }
  void piece_taken(H2Stream& s) override { wake_pump(s); }
  void calmed(std::string_view reason, std::string_view why) override {
    if (failed) return;
    common::log_json(spdlog::level::warn, "HTTP/2 connection ended",
                     {{"client", client_ip}, {"reason", why}});
    if (context->observers.h2_cut) context->observers.h2_cut(reason);
  }
  void wants_write() override {
    if (writer_waits) write_wake.cancel();
  }
  bool streams_body(H2Stream& s) override;
  void body_arrived(H2Stream& s) override {
    const auto it = uploads.find(s.id);
    if (it != uploads.end()) it->second->cancel();
  }
};

/// A streaming stream's body for the upstream (SPEC C50): each piece is what arrived since the
/// last one, taken once the last piece went out, so that the client's window is the bound.
class H2BodySource final : public RequestBodySource {
 public:
  H2BodySource(std::shared_ptr<H2Connection::Impl> connection, std::shared_ptr<H2Stream> stream)
      : connection_(std::move(connection)),
        stream_(std::move(stream)),
        wake_(connection_->stream.get_executor()) {}

  asio::awaitable<boost::system::error_code> next(std::string& piece, bool& done) override {
    auto& c = *connection_;
    H2Stream& s = *stream_;
    asio::steady_timer& wake = wake_;  // one per stream, not one per piece
    c.uploads[s.id] = &wake;
    const auto idle = std::chrono::duration_cast<Clock::duration>(s.config->limits.idle_timeout);
    boost::system::error_code ec;
    for (;;) {
      if (s.upload_too_large) {
        ec = bhttp::error::body_limit;
        break;
      }
      if (s.upload_discarded) {  // answered already (C47): the upstream gets no more
        ec = asio::error::operation_aborted;
        break;
      }
      if (!s.upload.empty() || s.upload_done) {
        c.codec->take_body(s, piece);
        done = s.upload_done;
        break;
      }
      if (s.closed || c.failed) {
        ec = asio::error::connection_reset;
        break;
      }
      // C07: a body that stops arriving for idle_timeout is cut.
      if (Clock::now() >= s.last_progress + idle) {
        c.codec->reset(s, NGHTTP2_CANCEL);
        ec = asio::error::timed_out;
        break;
      }
      wake.expires_at(s.last_progress + idle);
      co_await wake.async_wait(use_nothrow);
    }
    c.uploads.erase(s.id);
    if (ec && ec != asio::error::operation_aborted && s.cut.empty()) {
      s.cut = ec == bhttp::error::body_limit
                  ? "the request body exceeds max_streamed_body (" +
                        std::to_string(s.config->limits.max_streamed_body) + " bytes)"
                  : "reading the request body failed: " + ec.message();
    }
    co_return ec;
  }

 private:
  std::shared_ptr<H2Connection::Impl> connection_;
  std::shared_ptr<H2Stream> stream_;
  asio::steady_timer wake_;
};

bool H2Connection::Impl::streams_body(H2Stream& s) {
  if (!context->handler->streaming_pool()) return false;
  const auto& limits = s.config->limits;
  // A short body of known length is held: it may go out on a pooled connection, and again
  // after a stale one (C08).
  const auto field = s.request[bhttp::field::content_length];
  std::uint64_t declared = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), declared);
  if (!field.empty() && ec == std::errc() && end == field.data() + field.size() &&
      declared <= std::min(limits.stream_buffer, limits.max_request_body)) {
    return false;
  }
  if (assemble_request(s)) return false;  // refused: answered once the body has come
  const Request& req = s.request;
  const std::string_view t(req.target().data(), req.target().size());
  const Route* route =
      match(*s.config, req[bhttp::field::host], target_path(t), req.method_string());
  if (!route || !s.config->upstreams.contains(route->upstream)) return false;
  return !context->handler->holds(*route, req.base());
}

asio::awaitable<void> H2Connection::Impl::serve(std::shared_ptr<Impl> keep,
                                                std::shared_ptr<H2Stream> s) {
  (void)keep;
  struct Finish {
    Impl& self;
    H2Stream& stream;
    ~Finish() {
      self.codec->finished(stream);  // the request and its body are gone with this frame
      if (self.codec->running() == 0) self.done_wake.cancel();
    }
  } finish{*this, *s};
  const auto& cfg = *s->config;
  std::optional<Rejection> reject = assemble_request(*s);
  Request& req = s->request;
  // Before anything is answered: every answer carries the request's id (C32).
  std::string id_storage;
  s->request_id.assign(apply_request_id(req.base(), cfg.request_id, id_storage));
  s->trace_id.assign(request_trace_id(req.base()));
  const std::string origin(req[bhttp::field::origin]);
  const bool head = req.method() == bhttp::verb::head;

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
    RoutedRequest routed{std::move(req), s->config, s->route,      std::move(in_flight),    shed,
                         client_ip,      proto,     s->request_id, cfg.limits.stream_buffer};
    if (s->streaming) routed.body_source = std::make_shared<H2BodySource>(shared_from_this(), s);
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
  codec->submit(*s, result.response, head, streamed);
  if (streamed && !s->closed) co_await pump(s, std::move(result.tail));
  if (failed) log_done(*s);  // the connection ended under it: no stream close will come
}

asio::awaitable<void> H2Connection::Impl::pump(std::shared_ptr<H2Stream> s,
                                               std::shared_ptr<ResponseTail> tail) {
  // A body the handler did not hold (C39): one piece of at most stream_buffer bytes at a time,
  // the next read once the codec has taken the last piece (flow control is the backpressure).
  asio::steady_timer wake(stream.get_executor());
  pumps[s->id] = &wake;
  const std::size_t piece = std::max<std::size_t>(s->config->limits.stream_buffer, 1024);
  while (!s->closed && !failed && !s->out_eof) {
    if (s->out_sent < s->out.size()) {
      wake.expires_at(Clock::time_point::max());
      co_await wake.async_wait(use_nothrow);
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
      codec->reset(*s, NGHTTP2_INTERNAL_ERROR);
      break;
    }
    s->out.resize(got);
    s->out_sent = 0;
    s->out_eof = done;
    codec->more(*s);
  }
  pumps.erase(s->id);
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

asio::awaitable<void> H2Connection::Impl::write_loop(std::shared_ptr<Impl> keep) {
  (void)keep;
  while (!failed) {
    write_buffer.clear();
    if (!codec->send(write_buffer, kWriteBatch)) {
      failed = true;
      break;
    }
    if (!write_buffer.empty()) {
      writing = true;
      last_activity = Clock::now();
      auto [ec, n] = co_await asio::async_write(stream, asio::buffer(write_buffer), use_nothrow);
      writing = false;
      last_activity = Clock::now();
      last_write = last_activity;
      codec->wrote();  // answers going out: what the client sends may be their windows
      if (ec) {
        failed = true;
        break;
      }
      continue;
    }
    // Nothing to send. A session that wants neither to read nor to write is over (GOAWAY sent
    // or received and no stream left): the reader is woken to end.
    if (!codec->want_read() && !codec->want_write()) break;
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
    codec->reset_stalled(Clock::now(), idle);
    if (Clock::now() < last_activity + idle) continue;
    if (writing || said_goaway) {
      shut();
      break;
    }
    if (codec->running() == 0) {
      // Idle, or streams whose requests stopped arriving (C07): GOAWAY, then the connection
      // ends once it is written (or after one more period).
      said_goaway = true;
      codec->end();
      last_activity = Clock::now();
      continue;
    }
    // A client that holds a zero window while answers wait to be sent (C51): nothing written
    // for idle_timeout although a stream has bytes ready.
    if (codec->answers_held() && Clock::now() >= last_write + idle) {
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

void H2Connection::Impl::shut() {
  failed = true;
  if (codec) codec->stop();
  boost::system::error_code ignored;
  socket().close(ignored);
  write_wake.cancel();
  idle_timer.cancel();
  done_wake.cancel();
  for (auto& [id, wake] : pumps) wake->cancel();
  for (auto& [id, wake] : uploads) wake->cancel();
}

asio::awaitable<void> H2Connection::Impl::run(beast::flat_buffer& buffer) {
  try {
    codec.emplace([context = context] { return context->config(); }, *this);
  } catch (const std::exception& e) {
    common::log_json(spdlog::level::err, "HTTP/2 connection failed",
                     {{"client", client_ip}, {"error", e.what()}});
    co_return;
  }
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
  bool ok = codec->receive(buffer.data().data(), buffer.size());
  buffer.consume(buffer.size());
  wants_write();
  std::vector<char> chunk(kReadSize);
  while (ok && !failed && !writer_done && codec->want_read()) {
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(chunk), use_nothrow);
    if (ec) break;
    last_activity = Clock::now();
    ok = codec->receive(chunk.data(), n);
    wants_write();
  }
  if (!ok && !codec->calm()) {
    common::log_json(spdlog::level::debug, "HTTP/2 connection failed",
                     {{"client", client_ip}, {"error", codec->error()}});
  }
  ending = true;
  // What the codec still has to say (a GOAWAY after a protocol error) goes out first.
  wants_write();
  while (!writer_done && !failed) {
    done_wake.expires_at(Clock::time_point::max());
    co_await done_wake.async_wait(use_nothrow);
  }
  shut();
  // Handlers run to their end (C34); their answers have nowhere to go.
  while (codec->running() > 0) {
    done_wake.expires_at(Clock::time_point::max());
    co_await done_wake.async_wait(use_nothrow);
  }
  // Answers submitted but cut with the connection: their access lines (C32), not written.
  for (const auto& [id, s] : codec->streams()) {
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
  if (!self.codec || self.failed) return;
  self.codec->drain();
}

void H2Connection::close() {
  impl_->shut();
}

}  // namespace idemgate::http
