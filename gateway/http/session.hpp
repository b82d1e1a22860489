#pragma once
// One client connection: HTTP/1.1 keep-alive with pipelining, limits, framing checks, routing,
// hop-by-hop handling, and the access log (SPEC C01–C07, C16 framing, C32).

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>

#include "gateway/http/admission.hpp"
#include "gateway/http/connection_gate.hpp"
#include "gateway/http/handler.hpp"
#include "gateway/http/header_deadlines.hpp"
#include "gateway/http/settings.hpp"

namespace idemgate::http {

class Session;

/// Observers of a thread's sessions (metrics, SPEC C31). Each may be empty; each is called on
/// the session's io thread.
struct SessionObservers {
  std::function<void()> connection_opened;
  std::function<void()> connection_closed;
  /// After each answered request: the route name ("" when none matched), the outcome label of
  /// the access line, and the time spent on the upstream (zero when it was not called).
  std::function<void(std::string_view route, std::string_view outcome,
                     std::chrono::microseconds upstream_time)>
      request_done;
  /// A tunnel opened (true) or ended (false) (SPEC C40, `idemgate_open_tunnels`).
  std::function<void(bool opened)> tunnel;
  /// An HTTP/2 connection began (true) or ended (false) (SPEC C49).
  std::function<void(bool opened)> h2_connection;
  /// A request came as an HTTP/2 stream and was answered (SPEC C49); request_done sees it too.
  std::function<void()> h2_stream;
  /// An HTTP/2 connection was ended for passing a C51 bound: `reason` is one of
  /// kCalmReasons or `zero_window`.
  std::function<void(std::string_view reason)> h2_cut;
};

/// What the sessions of one io thread share. Owned by the Server; used on that thread only.
struct SessionContext {
  /// The configuration snapshot for the next request (a reload applies to new requests).
  std::function<std::shared_ptr<const ProxyConfig>()> config;
  /// The thread's handler; outlives every session of the thread.
  RequestHandler* handler = nullptr;
  /// Set when the server stops: no new request is read, responses carry `Connection: close`.
  bool draining = false;
  /// The live sessions, for draining.
  std::unordered_set<Session*> sessions;
  /// Called after a session has left `sessions` (may be empty).
  std::function<void()> on_session_end;
  /// Server-side TLS (`listen.tls`): when set, every connection starts with a TLS handshake
  /// (within header_read_timeout) and requests get `X-Forwarded-Proto: https`. Shared by the
  /// threads (OpenSSL contexts are thread-safe once set up); owned by the Server.
  boost::asio::ssl::context* tls = nullptr;
  SessionObservers observers;
  /// When set, every session holds one of its slots, taken by the acceptor before the accept,
  /// and gives it back when it ends (SPEC C52). Shared by the threads; owned by the Server.
  ConnectionGate* gate = nullptr;
  /// Load shedding (SPEC C52 max_tunnels, C53 max_in_flight); null: nothing is shed. Shared by
  /// the threads; owned by the Server.
  Admission* admission = nullptr;
  /// The thread's deadlines of request headers that take more than one read (C07, C54); null:
  /// each session times such a header with its own timer.
  std::unique_ptr<HeaderDeadlines> header_deadlines;
};

/// Serves one client connection until the client closes it, a limit or timeout ends it, or the
/// server drains.
///
/// Per request: waits `idle_timeout` for the first byte between requests (`header_read_timeout`
/// on a new connection), then `header_read_timeout` for the whole header section (C07); the
/// body must arrive within `idle_timeout`. Answers itself: 431 over `max_header_bytes`, 413
/// over `max_request_body` (C04), 400 `bad-framing` for CL with TE, conflicting Content-Length,
/// or a Transfer-Encoding whose final coding is not chunked, and 400 for other parse errors (C03),
/// all followed by closing the connection; 404 when no route matches (C01); `100 Continue` for
/// `Expect: 100-continue` before reading the body (C04; Expect is never forwarded).
/// The handler gets the decoded body with Content-Length framing, hop-by-hop fields removed,
/// X-Forwarded-For/-Proto/-Host and Via added (C02), and the handler's owned fields removed
/// (RequestHandler::strip_owned_fields, C16).
/// Responses get a fresh `Date`, `Via` appended and exactly one framing: Content-Length, none for
/// 1xx/204/304, and for HEAD the handler's Content-Length without a body (C03, C16). Requests on
/// one connection are answered in order (C06). An exception from the handler is logged and
/// answered with 500, then the connection closes. One JSON access line per request (C32).
///
/// Load shedding (SPEC C52, C53): once routed, a request whose route has `max_in_flight`
/// requests in progress is answered 503 `overloaded` with `Retry-After` (outcome `shed`) before
/// the handler sees it (no lock, no record); a held request's body is read first so that the
/// connection stays usable, a streamed one's is not (the connection closes). A WebSocket
/// upgrade while `max_tunnels` tunnels are open gets the same 503, nothing forwarded.
///
/// Over TLS the same, after the handshake; a connection that fails the handshake is closed.
///
/// Thread safety: all members are used on the socket's executor only.
class Session {
 public:
  virtual ~Session() = default;

  /// Server stop: closes the connection now if it waits for a request, otherwise after the
  /// response in progress (which gets `Connection: close`).
  virtual void drain() = 0;

  /// Closes the connection now; a request in progress still runs to its end in the handler.
  virtual void close() = 0;
};

/// Starts a Session on `socket`'s executor (over TLS when `context->tls` is set); it registers in
/// `context->sessions` while it runs. An exception escaping the session is logged; it ends only
/// that connection.
void start_session(boost::asio::ip::tcp::socket socket, std::shared_ptr<SessionContext> context);

}  // namespace idemgate::http
