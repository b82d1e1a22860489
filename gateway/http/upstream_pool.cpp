#include "gateway/http/upstream_pool.hpp"

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <deque>
#include <optional>
#include <tuple>

#include "gateway/common/deadline_list.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/upstream_response.hpp"

namespace idemgate::http {

using common::log_json;
using common::use_nothrow;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

/// While pooled (plain TCP) and not yet watched, a Connection is an entry of its pool's
/// idle_watches_ list, due kIdleWatchAfter after it went idle.
struct UpstreamPool::Connection : common::DeadlineList::Entry {
  Connection(asio::any_io_executor executor, common::HostPort to,
             std::shared_ptr<asio::ssl::context> tls_context)
      : server(std::move(to)), tls(std::move(tls_context)) {
    if (tls) {
      tls_stream.emplace(beast::tcp_stream(std::move(executor)), *tls);
    } else {
      plain.emplace(std::move(executor));
    }
  }
  ~Connection() {
    if (watch_list != nullptr) watch_list->remove(*this);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  beast::tcp_stream& tcp() { return tls_stream ? beast::get_lowest_layer(*tls_stream) : *plain; }

  common::HostPort server;  ///< the server it is connected to
  Clock::time_point idle_deadline{};
  /// While pooled and not yet watched: the list it waits in, and the pool state it is idle in.
  common::DeadlineList* watch_list = nullptr;
  UpstreamState* idle_state = nullptr;
  /// While pooled (plain TCP): set by the read armed on the idle socket, cleared when the
  /// connection is taken; the wait's completion checks it through a weak pointer.
  std::shared_ptr<bool> idle_watch;
  char idle_byte = 0;  ///< where the idle read puts a stray byte (the connection is then dropped)
  std::shared_ptr<asio::ssl::context> tls;  ///< set for a TLS upstream; outlives tls_stream
  std::optional<beast::tcp_stream> plain;   ///< exactly one of plain and tls_stream is set
  std::optional<TlsStream> tls_stream;
};

struct UpstreamPool::Wire {
  explicit Wire(Lease l) : lease(std::move(l)) {}
  Lease lease;
  bool writing = true;  ///< the request is still being written
  boost::system::error_code write_error;
  // A request whose body follows as it arrives (RequestBodySource): the response header is
  // awaited from the end of the request on, for request_timeout (as relay() does, C05).
  bool answered = false;   ///< the response header arrived (or reading it failed)
  bool timed_out = false;  ///< no response header within request_timeout of the request's end
  std::optional<asio::steady_timer> head_deadline;
};

struct UpstreamPool::Attempt {
  enum class Kind {
    response,   ///< complete response, or its header with a tail
    stale,      ///< failed before the first response byte: EOF, reset or write error
    timed_out,  ///< request_timeout ran out after (part of) the request was written
    failed,     ///< any other failure after writing
  };
  Kind kind = Kind::failed;
  Response response;
  std::shared_ptr<ResponseTail> tail;
  bool reusable = false;
  std::optional<std::chrono::seconds> keep_alive;  ///< the upstream's Keep-Alive: timeout=N
  std::string detail;
};

struct UpstreamPool::UpstreamState {
  std::size_t next_server = 0;
  std::deque<std::unique_ptr<Connection>> idle;  ///< oldest first
  /// The TLS client context of a `tls: true` upstream, built for `tls_ca_file`.
  std::shared_ptr<asio::ssl::context> tls;
  std::string tls_ca_file;
};

namespace {

/// How long before the upstream's announced keep-alive end a pooled connection is retired (C08).
constexpr auto kKeepAliveMargin = std::chrono::seconds(1);

// A non-blocking peek: EOF, an error or unsolicited bytes all mean the connection is unusable.
// One recv with MSG_DONTWAIT: toggling the socket's non-blocking mode through asio would cost
// two ioctls here and a third at the next asynchronous operation, on every pooled request.
bool peer_closed(tcp::socket& socket) {
  char byte = 0;
  ssize_t n = 0;
  do {
    n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

asio::awaitable<boost::system::error_code> connect(beast::tcp_stream* stream,
                                                   common::HostPort server, Duration timeout) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(server.host, ec);
  if (!ec) {
    stream->expires_after(timeout);
    auto [cec] = co_await stream->async_connect(tcp::endpoint(address, server.port), use_nothrow);
    ec = cec;
  } else {
    tcp::resolver resolver(stream->get_executor());
    auto [rec, endpoints] =
        co_await resolver.async_resolve(server.host, std::to_string(server.port), use_nothrow);
    if (rec) co_return rec;
    stream->expires_after(timeout);
    auto [cec, endpoint] = co_await stream->async_connect(endpoints, use_nothrow);
    ec = cec;
  }
  if (!ec) stream->socket().set_option(tcp::no_delay(true), ec);
  stream->expires_never();
  co_return ec;
}

std::shared_ptr<asio::ssl::context> make_client_tls(const Upstream& upstream, std::string& error) {
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
  context->set_verify_mode(asio::ssl::verify_peer);
  boost::system::error_code ec;
  if (upstream.tls_ca_file.empty()) {
    context->set_default_verify_paths(ec);
  } else {
    context->load_verify_file(upstream.tls_ca_file, ec);
  }
  if (ec) {
    error = "cannot load the CA certificates for upstream " + upstream.name + ": " + ec.message();
    return nullptr;
  }
  return context;
}

// TLS on an established TCP connection: SNI (names only, RFC 6066 §3), then a handshake that
// verifies the chain and that the certificate names `name`, within the connect timeout.
asio::awaitable<boost::system::error_code> handshake(TlsStream* stream, std::string name,
                                                     Duration timeout) {
  boost::system::error_code ec;
  asio::ip::make_address(name, ec);
  if (ec && !SSL_set_tlsext_host_name(stream->native_handle(), name.c_str())) {
    co_return boost::system::error_code(static_cast<int>(::ERR_get_error()),
                                        asio::error::get_ssl_category());
  }
  stream->set_verify_callback(asio::ssl::host_name_verification(name));
  beast::get_lowest_layer(*stream).expires_after(timeout);
  auto [hec] = co_await stream->async_handshake(asio::ssl::stream_base::client, use_nothrow);
  beast::get_lowest_layer(*stream).expires_never();
  co_return hec;
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
      if (wire->lease.connection) wire->lease.connection->tcp().close();
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
    wire->lease.connection->tcp().close();
  }
}

// `upstream` must stay valid until the returned awaitable completes.
asio::awaitable<boost::system::error_code> open(UpstreamPool::Connection* connection,
                                                common::HostPort server, const Upstream& upstream) {
  auto ec = co_await connect(&connection->tcp(), server, upstream.connect_timeout);
  if (ec || !connection->tls_stream) co_return ec;
  const std::string name =
      upstream.tls_server_name.empty() ? server.host : upstream.tls_server_name;
  co_return co_await handshake(&*connection->tls_stream, name, upstream.connect_timeout);
}

}  // namespace

UpstreamPool::UpstreamPool(asio::any_io_executor executor)
    : executor_(std::move(executor)),
      idle_watches_(executor_),
      head_scratch_(std::make_unique<std::array<char, kRenderedHeadBytes>>()) {}

UpstreamPool::~UpstreamPool() = default;

std::size_t UpstreamPool::idle_connections(const std::string& upstream) const {
  const auto it = upstreams_.find(upstream);
  return it == upstreams_.end() ? 0 : it->second->idle.size();
}

std::unique_ptr<UpstreamPool::Connection> UpstreamPool::take_idle(UpstreamState& state,
                                                                  const common::HostPort& server) {
  const auto now = Clock::now();
  std::erase_if(state.idle, [&](const auto& c) { return c->idle_deadline <= now; });
  // Most recently used first: the least likely to have been closed by the upstream.
  for (std::size_t i = state.idle.size(); i-- > 0;) {
    if (state.idle[i]->server != server) continue;
    auto connection = std::move(state.idle[i]);
    state.idle.erase(state.idle.begin() + static_cast<std::ptrdiff_t>(i));
    if (connection->watch_list != nullptr) {
      // Reused before its watch began: nothing to stop.
      connection->watch_list->remove(*connection);
      connection->watch_list = nullptr;
      return connection;
    }
    if (connection->idle_watch) {
      // Plain TCP: the armed read would have dropped a closed connection already; stop it
      // (no syscall) and reuse the connection as it is.
      *connection->idle_watch = false;
      connection->idle_watch.reset();
      boost::system::error_code ignored;
      connection->tcp().socket().cancel(ignored);
      return connection;
    }
    // TLS: a close_notify or any record is only seen by looking.
    if (!peer_closed(connection->tcp().socket())) return connection;
  }
  return nullptr;
}

void UpstreamPool::put_idle(UpstreamState& state, const Upstream& upstream,
                            std::unique_ptr<Connection> connection) {
  if (upstream.max_idle_connections <= 0) return;
  const auto now = Clock::now();
  std::erase_if(state.idle, [&](const auto& c) { return c->idle_deadline <= now; });
  while (state.idle.size() >= static_cast<std::size_t>(upstream.max_idle_connections)) {
    state.idle.pop_front();
  }
  if (!connection->tls_stream) {
    // Watched once it has been idle for kIdleWatchAfter: a connection reused sooner (the
    // usual case under load) costs no operation, syscall or allocation to pool.
    connection->deadline = now + kIdleWatchAfter;
    connection->on_due = &UpstreamPool::watch_idle;
    connection->watch_list = &idle_watches_;
    connection->idle_state = &state;
    idle_watches_.add(*connection);
  }
  state.idle.push_back(std::move(connection));
}

void UpstreamPool::watch_idle(common::DeadlineList::Entry& entry) {
  // The connection keeps a read armed: EOF, a reset or stray bytes from the upstream complete
  // it and the connection leaves the pool at once, so taking one later costs no syscall to
  // check it (C08 still retries one that closes as the request goes out). A read, not a
  // readiness wait: Asio re-arms the descriptor (epoll_ctl) for every wait, while a read after
  // the response's last read is queued on the registration the socket already has.
  auto* const raw = static_cast<Connection*>(&entry);
  raw->watch_list = nullptr;
  UpstreamState& state = *raw->idle_state;
  auto watch = std::make_shared<bool>(true);
  raw->idle_watch = watch;
  raw->tcp().socket().async_read_some(
      asio::buffer(&raw->idle_byte, 1), [&state, raw, weak = std::weak_ptr<bool>(watch)](
                                            const boost::system::error_code&, std::size_t) {
        const auto armed = weak.lock();
        if (!armed || !*armed) return;  // taken for a request, or already destroyed
        std::erase_if(state.idle, [raw](const auto& c) { return c.get() == raw; });
      });
}

UpstreamPool::UpstreamState* UpstreamPool::state_for(const Upstream& upstream, std::string& error) {
  auto& slot = upstreams_[upstream.name];
  if (!slot) slot = std::make_unique<UpstreamState>();
  UpstreamState& state = *slot;
  if (!upstream.tls) {
    state.tls = nullptr;
  } else if (!state.tls || state.tls_ca_file != upstream.tls_ca_file) {
    // First use, or a reload changed the CA: pooled connections keep the context they had.
    state.tls = make_client_tls(upstream, error);
    state.tls_ca_file = upstream.tls_ca_file;
    if (!state.tls) return nullptr;
  }
  return &state;
}

namespace {
void delete_connection(UpstreamPool::Connection* connection) {
  delete connection;
}
}  // namespace

ByteStream UpstreamPool::stream_of(Connection& connection) {
  return connection.tls_stream ? ByteStream(*connection.tls_stream) : ByteStream(*connection.plain);
}

asio::awaitable<UpstreamPool::Lease> UpstreamPool::lease(const Upstream& upstream,
                                                         bool allow_pooled) {
  Lease out;
  out.connection = {nullptr, &delete_connection};
  UpstreamState* const state = state_for(upstream, out.detail);
  if (!state) co_return out;
  const std::size_t count = upstream.servers.size();
  const std::size_t first = count == 0 ? 0 : state->next_server++ % count;
  std::string last_error = "the upstream has no servers";
  for (std::size_t i = 0; i < count; ++i) {
    const common::HostPort server = upstream.servers[(first + i) % count];
    if (allow_pooled) {
      if (auto idle = take_idle(*state, server)) {
        out.connection.reset(idle.release());
        out.pooled = true;
        out.server = server;
        co_return out;
      }
    }
    auto connection = std::make_unique<Connection>(executor_, server, state->tls);
    const auto ec = co_await open(connection.get(), server, upstream);
    if (ec) {
      // Nothing was written: the next server may take it (C08).
      last_error = common::format_host_port(server) + ": " + ec.message();
      continue;
    }
    out.connection.reset(connection.release());
    out.server = server;
    co_return out;
  }
  out.detail =
      "no server of upstream " + upstream.name + " accepted a connection (" + last_error + ")";
  co_return out;
}

UpstreamPool::Lease UpstreamPool::take_pooled(const Upstream& upstream) {
  Lease out;
  out.connection = {nullptr, &delete_connection};
  UpstreamState* const state = state_for(upstream, out.detail);
  const std::size_t count = upstream.servers.size();
  if (state == nullptr || count == 0) return out;
  const common::HostPort& server = upstream.servers[state->next_server % count];
  if (auto idle = take_idle(*state, server)) {
    ++state->next_server;
    out.connection.reset(idle.release());
    out.pooled = true;
    out.server = server;
  }
  return out;
}

asio::awaitable<UpstreamPool::Lease> UpstreamPool::reconnect(const Upstream& upstream,
                                                             common::HostPort server) {
  Lease out;
  out.connection = {nullptr, &delete_connection};
  out.server = server;
  UpstreamState* const state = state_for(upstream, out.detail);
  if (!state) co_return out;
  auto connection = std::make_unique<Connection>(executor_, server, state->tls);
  const auto ec = co_await open(connection.get(), server, upstream);
  if (ec) {
    out.detail = upstream_where(upstream, server) + ": reconnecting failed: " + ec.message();
    co_return out;
  }
  out.connection.reset(connection.release());
  co_return out;
}

void UpstreamPool::give_back(const Upstream& upstream, Lease lease,
                             std::optional<std::chrono::seconds> keep_alive) {
  if (!lease.connection) return;
  std::string error;
  UpstreamState* const state = state_for(upstream, error);
  if (!state) return;
  auto keep = std::chrono::duration_cast<Clock::duration>(upstream.idle_timeout);
  if (keep_alive) keep = std::min<Clock::duration>(keep, *keep_alive - kKeepAliveMargin);
  if (keep <= Clock::duration::zero()) return;
  std::unique_ptr<Connection> connection(lease.connection.release());
  connection->tcp().expires_never();
  connection->idle_deadline = Clock::now() + keep;
  put_idle(*state, upstream, std::move(connection));
}

std::string upstream_where(const Upstream& upstream, const common::HostPort& server) {
  return "upstream " + upstream.name + " (" + common::format_host_port(server) + ")";
}

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

namespace {

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

}  // namespace

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

ResponseTail::ResponseTail(UpstreamPool& pool, Upstream upstream,
                           std::shared_ptr<UpstreamPool::Wire> wire,
                           std::unique_ptr<StreamResponseParser> p, beast::flat_buffer b,
                           std::string bytes)
    : parser(std::move(p)),
      buffer(std::move(b)),
      prefix(std::move(bytes)),
      pool_(&pool),
      upstream_(std::move(upstream)),
      wire_(std::move(wire)) {}

ResponseTail::~ResponseTail() {
  // A request still being written holds the wire: closing ends that write too.
  if (wire_->lease.connection) wire_->lease.connection->tcp().close();
}

ByteStream ResponseTail::stream() {
  return UpstreamPool::stream_of(*wire_->lease.connection);
}

void ResponseTail::finish() {
  if (!parser->is_done() || !parser->keep_alive() || parser->need_eof() || buffer.size() > 0 ||
      wire_->writing || wire_->write_error) {
    return;
  }
  pool_->give_back(upstream_, std::move(wire_->lease), keep_alive_timeout(parser->get().base()));
}

asio::awaitable<bool> UpstreamPool::exchange(std::shared_ptr<Wire> wire,
                                             std::shared_ptr<const Request> request,
                                             const Upstream& upstream, bool head,
                                             std::size_t hold_limit,
                                             std::shared_ptr<RequestBodySource> request_body,
                                             Attempt& attempt) {
  Connection& connection = *wire->lease.connection;
  ByteStream stream = stream_of(connection);
  const bool streamed_body = request_body != nullptr;
  if (request_body) {
    // Each write within idle_timeout; the header's deadline starts once the body is out. The
    // writer may run at once up to its first write: the read's expiry is cleared after it.
    asio::co_spawn(executor_,
                   write_streamed_request(wire, request, std::move(request_body),
                                          upstream.idle_timeout, upstream.request_timeout),
                   common::log_on_exception("upstream request write failed"));
    connection.tcp().expires_never();
  } else {
    // One deadline for writing the request and reading the held response, set before either
    // starts (it is per direction once they run).
    connection.tcp().expires_after(upstream.request_timeout);
    const std::size_t sent = write_at_once(*wire, *request, *head_scratch_);
    if (wire->writing) {
      asio::co_spawn(executor_, write_request(wire, request, sent),
                     common::log_on_exception("upstream request write failed"));
    }
  }

  // Bounded: a chunk-size line or trailer section from the upstream must fit in it along with
  // the header section.
  beast::flat_buffer buffer{2 * kMaxResponseHeaderBytes};
  std::unique_ptr<StreamResponseParser> parser;
  const ResponseHead got = co_await read_response_head(stream, buffer, parser, head, false);
  wire->answered = true;
  if (wire->head_deadline) wire->head_deadline->cancel();
  // The rest of a streamed request's response: within request_timeout of its header.
  if (streamed_body && !got.error) connection.tcp().expires_after(upstream.request_timeout);
  const auto fail = [&](Attempt::Kind kind, std::string detail) {
    attempt.kind = kind;
    attempt.detail = std::move(detail);
    connection.tcp().close();  // ends a write still running
    return kind == Attempt::Kind::stale;
  };
  if (NoResponse failure = no_response(got, wire->write_error, wire->timed_out);
      !failure.detail.empty()) {
    const auto kind = failure.timed_out ? Attempt::Kind::timed_out
                      : failure.stale   ? Attempt::Kind::stale
                                        : Attempt::Kind::failed;
    co_return fail(kind, std::move(failure.detail));
  }

  // Trailer fields of a chunked body are merged into the fields by the parser: keep the header.
  auto header = parser->get().base();
  const auto length = parser->content_length();
  std::string body;
  std::size_t filled = 0;
  bool pass_on = !parser->is_done() && length && *length > hold_limit;  // C39
  if (!pass_on && length && !parser->is_done()) {
    if (*length > upstream.max_response_body) {
      co_return fail(Attempt::Kind::failed, "the response body is larger than max_response_body");
    }
    body.resize(static_cast<std::size_t>(*length));
  }
  while (!pass_on && !parser->is_done()) {
    constexpr std::size_t kPiece = 64 * 1024;
    if (!length && body.size() - filled < kPiece)
      body.resize(std::max(2 * body.size(), filled + kPiece));
    const std::size_t room = body.size() - filled;
    parser->get().body().data = body.data() + filled;
    parser->get().body().size = room;
    const auto ec = co_await async_read_body(stream, buffer, *parser);
    filled += room - parser->get().body().size;
    if (ec) {
      co_return fail(ec == beast::error::timeout ? Attempt::Kind::timed_out : Attempt::Kind::failed,
                     "reading the response body failed: " + ec.message());
    }
    if (!parser->is_done() && filled > hold_limit) {
      pass_on = true;  // C39: the held part of a chunked body passed the limit
    } else if (filled > upstream.max_response_body) {
      co_return fail(Attempt::Kind::failed, "the response body is larger than max_response_body");
    }
  }
  body.resize(filled);

  attempt.kind = Attempt::Kind::response;
  attempt.keep_alive = keep_alive_timeout(header);
  if (pass_on) {
    auto finished = finish_upstream_response(*parser, std::move(header), {}, head, 0);
    finished.response.erase(bhttp::field::content_length);
    attempt.response = std::move(finished.response);
    attempt.tail = std::make_shared<ResponseTail>(
        *this, upstream, std::move(wire), std::move(parser), std::move(buffer), std::move(body));
    co_return false;
  }
  auto finished =
      finish_upstream_response(*parser, std::move(header), std::move(body), head, buffer.size());
  attempt.response = std::move(finished.response);
  // A complete answer before the whole request went out (C47): the connection carries nothing
  // more, and the write still waiting on it ends.
  attempt.reusable = finished.reusable && !wire->writing && !wire->write_error;
  if (wire->writing) connection.tcp().close();
  co_return false;
}

asio::awaitable<ForwardResult> UpstreamPool::forward(const Upstream& upstream_ref,
                                                     Request request_in, std::size_t hold_limit,
                                                     std::shared_ptr<RequestBodySource> body) {
  // A copy: the reference is only promised until the first suspension.
  const Upstream upstream = upstream_ref;
  const auto start = Clock::now();
  ForwardResult result;

  request_in.version(11);
  request_in.keep_alive(true);
  request_in.erase(bhttp::field::transfer_encoding);
  if (body) {
    // Its length as the client declared it, else chunked (C50).
    if (!request_in.has_content_length()) request_in.chunked(true);
  } else if (!request_in.body().empty() || request_in.has_content_length()) {
    request_in.content_length(request_in.body().size());
  }
  const bool head = request_in.method() == bhttp::verb::head;
  // An HTTP/1.0 client may omit Host, which an HTTP/1.1 request must carry (RFC 9112 §3.2).
  const bool client_sent_host = request_in.count(bhttp::field::host) > 0;
  auto request = std::make_shared<Request>(std::move(request_in));

  // A body that follows as it arrives cannot be sent twice: a fresh connection (C08).
  Attempt attempt;
  std::shared_ptr<Wire> wire;
  common::HostPort server;
  const auto exchange_on = [&](Lease& lease) {
    server = lease.server;
    if (!client_sent_host) request->set(bhttp::field::host, common::format_host_port(server));
    wire = std::make_shared<Wire>(std::move(lease));
    attempt = Attempt{};
    return exchange(wire, request, upstream, head, hold_limit, body, attempt);
  };
  Attempts ran = co_await attempts(upstream, body == nullptr, exchange_on);
  if (!ran.exchanged) {
    // Not reached at all, or a stale pooled connection whose reconnect failed.
    result.kind =
        ran.reached ? ForwardResult::Kind::unknown_outcome : ForwardResult::Kind::not_reached;
    result.detail = ran.reached ? "a pooled connection closed; " + std::move(ran.lease.detail)
                                : std::move(ran.lease.detail);
  } else {
    switch (attempt.kind) {
      case Attempt::Kind::response:
        result.kind = ForwardResult::Kind::response;
        result.response = std::move(attempt.response);
        result.tail = std::move(attempt.tail);
        if (attempt.reusable) give_back(upstream, std::move(wire->lease), attempt.keep_alive);
        break;
      case Attempt::Kind::timed_out:
        result.kind = ForwardResult::Kind::timed_out;
        result.detail =
            upstream_where(upstream, server) + " gave no complete response within request_timeout";
        break;
      case Attempt::Kind::stale:
      case Attempt::Kind::failed:
        result.kind = ForwardResult::Kind::unknown_outcome;
        result.detail = upstream_where(upstream, server) + ": " + attempt.detail;
        break;
    }
  }
  result.upstream_time =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  co_return result;
}

Response forward_result_response(ForwardResult result) {
  switch (result.kind) {
    case ForwardResult::Kind::response:
      return std::move(result.response);
    case ForwardResult::Kind::not_reached:
      return make_problem(Problem::upstream_unreachable, std::move(result.detail), 11, true);
    case ForwardResult::Kind::unknown_outcome:
      return make_problem(Problem::upstream_failed, std::move(result.detail), 11, true);
    case ForwardResult::Kind::timed_out:
      return make_problem(Problem::upstream_timeout, std::move(result.detail), 11, true);
  }
  return make_problem(Problem::internal_error, "unknown forward result", 11, true);
}

ProxyHandler::ProxyHandler(std::shared_ptr<Forwarder> forwarder)
    : forwarder_(std::move(forwarder)) {}

asio::awaitable<HandlerResult> ProxyHandler::handle(Exchange exchange) {
  auto result = co_await forwarder_->forward(*exchange.upstream, std::move(exchange.request),
                                             kHoldWhole, std::move(exchange.body_source));
  HandlerResult out;
  out.upstream_time = result.upstream_time;
  if (result.kind == ForwardResult::Kind::response) {
    out.outcome = "passthrough";
  } else {
    out.outcome = "upstream_error";
    log_json(spdlog::level::warn, "upstream failed",
             {{"route", exchange.route->name},
              {"upstream", exchange.upstream->name},
              {"detail", result.detail}});
  }
  out.response = forward_result_response(std::move(result));
  co_return out;
}

}  // namespace idemgate::http
