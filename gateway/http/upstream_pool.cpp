#include "gateway/http/upstream_pool.hpp"

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <algorithm>
#include <cerrno>

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <deque>
#include <optional>

#include "gateway/common/deadline_list.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/common/json_log.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/relay.hpp"
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

asio::awaitable<ForwardResult> UpstreamPool::forward(const Upstream& upstream, Request request,
                                                     std::size_t hold_limit,
                                                     std::shared_ptr<RequestBodySource> body) {
  return relay_held(*this, upstream, std::move(request), hold_limit, std::move(body));
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
  auto result = co_await forwarder_->forward(*exchange.upstream, std::move(exchange.forwardable()),
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
