#pragma once
// Pooled keep-alive connections to upstream servers, server selection and C08's retry (SPEC C03,
// C05, C06, C08, C09), the Forwarder whose exchanges relay.hpp runs (relay_held), and the plain
// forwarding RequestHandler.

#include <array>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/common/deadline_list.hpp"
#include "gateway/common/host_port.hpp"
#include "gateway/http/byte_stream.hpp"
#include "gateway/http/handler.hpp"
#include "gateway/http/upstream_response.hpp"

namespace idemgate::http {

/// A Forwarder with one keep-alive pool per upstream server. One instance per io thread.
/// forward() is relay_held() (relay.hpp): the relay's exchange with the answer held, so held,
/// streamed and upgraded requests reach the upstream through one client.
///
/// - Servers are used round robin. Only a connect failure (refused, unreachable, past
///   `connect_timeout`) moves a request to the next server; once a byte was written the request
///   never goes to another server (C08).
/// - `tls: true` upstreams: TLS 1.2+ with SNI, the certificate verified against `tls_ca_file`
///   (or the system store) and `tls_server_name` (or the server's host). A failed handshake is
///   a failed connect: nothing was written, the next server is tried.
/// - The request goes out as HTTP/1.1 with Content-Length framing; a request without `Host`
///   gets the server's `host:port`.
/// - `request_timeout` covers writing the request and reading the whole response (→ timed_out).
/// - Full duplex (C47): the response is read while the request is written. A complete answer
///   that arrives before the whole request went out is the answer, whether the upstream then
///   stops reading, closes or resets; the connection is then closed, never pooled.
/// - A pooled connection that fails before the first response byte (write error, EOF or reset)
///   is retried once on a fresh connection to the same server (C08). Any other failure after
///   writing → unknown_outcome (or timed_out).
/// - Responses: 1xx interim responses are skipped; chunked bodies are decoded and trailers
///   dropped; hop-by-hop fields are removed (the fields a handler owns are its own to remove,
///   C16); `Content-Length` is the decoded body size (for HEAD: the upstream's value). A body
///   longer than forward()'s `hold_limit` (its Content-Length, or the part of a chunked body
///   read so far) is left on the connection as a ResponseTail (C39); a held body over
///   `max_response_body` → unknown_outcome.
/// - Idle connections are kept up to `max_idle_connections` per upstream and dropped after
///   `idle_timeout`, or one second before the upstream's `Keep-Alive: timeout=N` if that is
///   sooner. A plain connection idle for kIdleWatchAfter (100 ms) is watched, and leaves the pool
///   as soon as the upstream closes it; one closed sooner may be handed out, and its request is
///   retried once on a fresh connection (C08).
///
/// Thread safety: not thread-safe; use from the executor's single thread only. forward() never
/// throws for network errors. Destroying the pool closes its idle connections; it must outlive
/// forward() calls in progress.
class UpstreamPool final : public Forwarder {
 public:
  explicit UpstreamPool(boost::asio::any_io_executor executor);
  ~UpstreamPool() override;
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  boost::asio::awaitable<ForwardResult> forward(
      const Upstream& upstream, Request request, std::size_t hold_limit,
      std::shared_ptr<RequestBodySource> body = nullptr) override;

  /// Idle pooled connections to `upstream` right now (for tests and metrics).
  std::size_t idle_connections(const std::string& upstream) const;

  struct Connection;  ///< one upstream connection, plain or TLS (defined in the .cpp)
  struct Wire;        ///< a leased connection with a request being written on it

  /// A connection lent for one streamed exchange or tunnel (SPEC C38, C40); give it back with
  /// give_back() when its response ended cleanly, or let it go (closed) otherwise.
  struct Lease {
    std::unique_ptr<Connection, void (*)(Connection*)> connection{nullptr, nullptr};
    /// Taken from the idle pool: the upstream may have closed it as the request went out; a
    /// failure before the first response byte may then be retried once on reconnect() (C08).
    bool pooled = false;
    common::HostPort server;  ///< the server it is connected to
    std::string detail;       ///< why there is no connection, when `connection` is null
  };

  /// A connection to one of `upstream`'s servers: round robin, the next server only after a
  /// connect failure (C08); an idle pooled one when `allow_pooled`. Never throws for network
  /// errors: a null `connection` and a `detail` instead. `upstream` must stay valid until the
  /// returned awaitable completes (the caller holds its configuration snapshot).
  boost::asio::awaitable<Lease> lease(const Upstream& upstream, bool allow_pooled);
  /// lease() without suspending when it can: an idle pooled connection to the server round robin
  /// picks next. A null `connection` when that server has none idle (lease() then picks the same
  /// server); `detail` says why when the upstream's TLS context cannot be built.
  Lease take_pooled(const Upstream& upstream);
  /// A fresh connection to `server` of `upstream` (the C08 retry of a stale pooled connection).
  boost::asio::awaitable<Lease> reconnect(const Upstream& upstream, common::HostPort server);
  /// How the attempts of one request ended (SPEC C08).
  struct Attempts {
    /// The last attempt's connection as its exchange left it (it may have moved it on); null
    /// with `detail` set when that attempt got no connection.
    Lease lease;
    bool exchanged = false;  ///< the last attempt had a connection and ran its exchange
    bool reached = false;    ///< an attempt had a connection: a failure is no "unreachable"
  };

  /// The attempts of one request, written once for every upstream client (SPEC C08): a
  /// connection to `upstream` (lease(); an idle pooled one when `retryable`, taken without
  /// suspending when the server round robin picks has one), then `exchange(lease)`, which
  /// returns an `awaitable<bool>`: true when the connection closed before any response byte.
  /// Only then, only for a pooled connection and a `retryable` request, the exchange runs once
  /// more on a fresh connection to the same server, never on another. `upstream` must outlive
  /// the awaitable.
  template <class Exchange>
  boost::asio::awaitable<Attempts> attempts(const Upstream& upstream, bool retryable,
                                            Exchange exchange);
  /// Returns a connection whose last response ended cleanly (complete, keep-alive, nothing read
  /// past it) to the idle pool; `keep_alive` is the upstream's `Keep-Alive: timeout=N`.
  void give_back(const Upstream& upstream, Lease lease,
                 std::optional<std::chrono::seconds> keep_alive);
  /// The byte stream of a leased connection.
  static ByteStream stream_of(Connection& connection);

  /// The most bytes of a request head forward() renders itself (render_head) to write the
  /// request at once; a longer head goes through Beast's serializer.
  static constexpr std::size_t kRenderedHeadBytes = 16 * 1024;
  /// Where forward() renders a request head to write it at once (one request at a time: the
  /// bytes are written or copied before the next).
  std::array<char, kRenderedHeadBytes>& head_scratch() { return *head_scratch_; }
  /// The thread's deadline list of the pool: idle connections not yet watched, and the clocks
  /// of forward()'s exchanges.
  common::DeadlineList& deadlines() { return idle_watches_; }

 private:
  struct UpstreamState;
  /// The pool state of `upstream`, with its TLS context (re)built when needed; null with
  /// `error` set when the CA file cannot be loaded.
  UpstreamState* state_for(const Upstream& upstream, std::string& error);
  std::unique_ptr<Connection> take_idle(UpstreamState& state, const common::HostPort& server);
  void put_idle(UpstreamState& state, const Upstream& upstream,
                std::unique_ptr<Connection> connection);
  /// Arms the read that notices the upstream closing an idle connection (on_due of a pooled
  /// Connection's entry).
  static void watch_idle(common::DeadlineList::Entry& entry);

  /// How long a pooled plain connection is idle before a read watches it.
  static constexpr std::chrono::milliseconds kIdleWatchAfter{100};

  boost::asio::any_io_executor executor_;
  /// Pooled connections not yet watched, and forward()'s clocks; destroyed after the
  /// connections in upstreams_.
  common::DeadlineList idle_watches_;
  std::map<std::string, std::unique_ptr<UpstreamState>, std::less<>> upstreams_;
  std::unique_ptr<std::array<char, kRenderedHeadBytes>> head_scratch_;
};

/// A leased connection and the notes of the writer that sends a request on it, shared by the
/// exchange and that writer (which may outlive it: C47) and, for a passed-on body, the
/// ResponseTail.
struct UpstreamPool::Wire {
  explicit Wire(Lease l) : lease(std::move(l)) {}
  Lease lease;
  bool writing = true;  ///< the request is still being written
  boost::system::error_code write_error;
  // A request whose body follows as it arrives (RequestBodySource): the response header is
  // awaited from the end of the request on, for request_timeout (as relay() does, C05).
  bool answered = false;   ///< the response header arrived (or reading it failed)
  bool timed_out = false;  ///< no response header within request_timeout of the request's end
  std::optional<boost::asio::steady_timer> head_deadline;
};

template <class Exchange>
boost::asio::awaitable<UpstreamPool::Attempts> UpstreamPool::attempts(const Upstream& upstream,
                                                                      bool retryable,
                                                                      Exchange exchange) {
  Attempts out;
  if (retryable) out.lease = take_pooled(upstream);  // the usual case: no task
  if (!out.lease.connection) out.lease = co_await lease(upstream, retryable);
  for (int round = 0; out.lease.connection; ++round) {
    out.reached = true;
    const bool pooled = out.lease.pooled;
    const common::HostPort server = out.lease.server;
    const bool closed_unanswered = co_await exchange(out.lease);
    if (!closed_unanswered || !pooled || !retryable || round > 0) {
      out.exchanged = true;
      break;
    }
    // The upstream closed the idle connection as the request went out, before answering.
    out.lease = co_await reconnect(upstream, server);
  }
  co_return out;
}

/// The body of an upstream response that forward() did not hold (SPEC C39): the header is read,
/// `prefix` holds the body bytes read before the body passed the hold limit (a chunked body), the
/// rest is still on the connection. The session sends it on with send_tail() (relay.hpp). The
/// connection closes when the tail is destroyed, unless finish() gave it back to the pool.
/// Used on its pool's thread only; the pool must outlive it.
struct ResponseTail {
  ResponseTail(UpstreamPool& pool, Upstream upstream, std::shared_ptr<UpstreamPool::Wire> wire,
               std::unique_ptr<StreamResponseParser> parser, boost::beast::flat_buffer buffer,
               std::string prefix);
  ~ResponseTail();
  ResponseTail(const ResponseTail&) = delete;
  ResponseTail& operator=(const ResponseTail&) = delete;

  /// The upstream connection the rest of the body comes from.
  ByteStream stream();
  /// The upstream's `idle_timeout`: each read of the rest must progress within it.
  Duration idle_timeout() const { return upstream_.idle_timeout; }
  /// The upstream's name, for log lines.
  std::string_view upstream_name() const { return upstream_.name; }
  /// Returns the connection to the pool when the body has ended cleanly and the connection may
  /// carry another request (the whole request was written, nothing was read past the response).
  void finish();

  std::unique_ptr<StreamResponseParser> parser;  ///< the header is parsed; the body follows
  boost::beast::flat_buffer buffer;              ///< bytes read past what the parser took
  std::string prefix;                            ///< body bytes already read, to send first

 private:
  UpstreamPool* pool_;
  Upstream upstream_;
  std::shared_ptr<UpstreamPool::Wire> wire_;
};

/// `upstream NAME (host:port)`: how a problem's detail names the server an exchange went to.
std::string upstream_where(const Upstream& upstream, const common::HostPort& server);

/// The response for a ForwardResult that holds none (SPEC C05): not_reached → 502
/// `upstream-unreachable`, unknown_outcome → 502 `upstream-failed`, timed_out → 504
/// `upstream-timeout`; problem+json with `result.detail`. For Kind::response, the response itself.
Response forward_result_response(ForwardResult result);

/// The plain proxy: forwards every request and returns the upstream's response unchanged
/// (SPEC C09), outcome "passthrough"; upstream failures become problem responses (C05).
/// Thread safety: one instance per io thread, like its Forwarder.
class ProxyHandler final : public RequestHandler {
 public:
  explicit ProxyHandler(std::shared_ptr<Forwarder> forwarder);
  boost::asio::awaitable<HandlerResult> handle(Exchange exchange) override;

 private:
  std::shared_ptr<Forwarder> forwarder_;
};

}  // namespace idemgate::http
