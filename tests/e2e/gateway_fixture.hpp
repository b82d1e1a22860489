#pragma once
// End-to-end fixture for the gateway: the real `idemgate` and `payment-service` binaries as child
// processes on loopback, a small in-test upstream for statuses and failures the payment service
// does not produce, and direct looks into Postgres and Redis to check what the gateway stored.
//
// Stores come from IDEMGATE_PG_DSN, IDEMGATE_PAYMENTS_DSN and IDEMGATE_REDIS_ADDR, binaries from
// IDEMGATE_BINARY_DIR; a missing variable throws, so the test fails rather than skips (STYLE).
// Tests share the databases with other runs: they use unique keys and payment ids
// (unique_name()) and never truncate a table.

#include <boost/json/object.hpp>
#include <boost/test/tools/assertion_result.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/support/http_client.hpp"
#include "tests/support/polling.hpp"
#include "tests/support/process.hpp"

struct redisContext;  // hiredis
struct pg_conn;       // libpq's PGconn

namespace idemgate::test::e2e {

/// The loopback address every process here listens on.
inline const std::string kLoopback = "127.0.0.1";

// The fixture's safety deadline and its poll (tests/support/polling.hpp).
using test::eventually;
using test::kEventDeadline;

/// `prefix-<random per run>-<counter>`: unique across runs and within one, so that tests
/// sharing a database never meet each other's keys or payments. Thread-safe.
std::string unique_name(std::string_view prefix);

/// The last `lines` lines of the file at `path` ("" when it cannot be read).
std::string file_tail(const std::string& path, std::size_t lines = 30);

/// Status, fields and body of a response, for failure messages.
std::string describe(const HttpResponse& response);

/// True when `response` is an RFC 9457 problem (SPEC C33): status `status`, Content-Type
/// `application/problem+json`, and a JSON object body whose `type`, `title` and `detail` are
/// non-empty strings and whose `status` equals the HTTP status. The failure message says what
/// is wrong and shows the response. Use as `BOOST_TEST(is_problem(res, 404))`.
boost::test_tools::assertion_result is_problem(const HttpResponse& response, unsigned status);

/// The `type` member of a problem body ("" when the body is not a JSON object with one).
std::string problem_type(const HttpResponse& response);

/// A directory under the system temp directory, removed with its content by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// The `port` of the first JSON line in the file at `stderr_path` whose `msg` is `msg` (e.g.
/// `admin listening`), or nullopt.
std::optional<std::uint16_t> logged_port(const std::string& stderr_path, const std::string& msg);

/// Waits until the child logs its JSON `listening` line on stderr (both binaries log
/// `{"msg":"listening",…,"port":N}` once their socket is bound) and returns that port. Throws
/// std::runtime_error with the stderr tail when the child exits or kEventDeadline passes.
std::uint16_t wait_for_listening(ChildProcess& child, const std::string& stderr_path,
                                 const std::string& what);

// ---------------------------------------------------------------------------------------------

/// The example upstream (examples/payment-service) on an OS-chosen loopback port against
/// IDEMGATE_PAYMENTS_DSN. Started and ready (/healthz answered) when the constructor returns;
/// stopped by PID in the destructor.
class PaymentService {
 public:
  struct Options {
    int delay_ms = 0;  ///< `--delay-ms`: every POST sleeps this long before its work
    /// `--keep-alive-timeout` in seconds (advertised as `Keep-Alive: timeout=N`); 0: the
    /// service's default.
    int keep_alive_timeout_s = 0;
  };

  PaymentService() : PaymentService(Options{}) {}
  explicit PaymentService(Options options);
  ~PaymentService();
  PaymentService(const PaymentService&) = delete;
  PaymentService& operator=(const PaymentService&) = delete;

  std::uint16_t port() const { return port_; }
  /// `127.0.0.1:PORT`, as a gateway upstream server.
  std::string address() const;
  /// GET /stats: payment_posts, payments_inserted, refunds, events… since start.
  boost::json::object stats() const;
  /// One counter of stats().
  std::uint64_t counter(const char* name) const;
  /// Waits until counter(name) ≥ value (the service counts a POST before its delay, so this
  /// tells that a request has reached it). Returns false after kEventDeadline.
  bool wait_for_counter(const char* name, std::uint64_t value) const;
  std::string stderr_tail() const { return file_tail(stderr_path_); }

 private:
  TempDir dir_;
  std::string stderr_path_;
  ChildProcess child_;
  std::uint16_t port_ = 0;
};

/// A request body for POST /payments of the payment service.
std::string payment_body(const std::string& external_id, const std::string& amount = "10.50",
                         const std::string& provider = "stripe");

// ---------------------------------------------------------------------------------------------

/// tests/support/stream_upstream.cpp (`stream-upstream`) on an OS-chosen loopback port: pattern
/// bodies of any size generated and checked piece by piece, an upstream dying mid-body, a
/// WebSocket echo, the received fields as JSON (SPEC C38, C40), early answers to uploads, a
/// response streaming during its upload, a quiet event stream and a 101 to the wrong protocol
/// (C40, C47, C48). Listening when the constructor
/// returns; stopped by PID in the destructor.
class StreamUpstream {
 public:
  StreamUpstream();
  ~StreamUpstream();
  StreamUpstream(const StreamUpstream&) = delete;
  StreamUpstream& operator=(const StreamUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  /// `127.0.0.1:PORT`, as a gateway upstream server.
  std::string address() const;
  /// GET /stats: bytes_written_total, sink_done, sink_incomplete, ws_open… since start.
  boost::json::object stats() const;
  /// One counter of stats().
  std::uint64_t counter(const char* name) const;
  /// Waits until counter(name) ≥ value; false after kEventDeadline.
  bool wait_for_counter(const char* name, std::uint64_t value) const;
  /// Waits until counter(name) == value; false after kEventDeadline.
  bool wait_for_counter_equal(const char* name, std::uint64_t value) const;
  std::string stderr_tail() const { return file_tail(stderr_path_); }

 private:
  TempDir dir_;
  std::string stderr_path_;
  ChildProcess child_;
  std::uint16_t port_ = 0;
};

// ---------------------------------------------------------------------------------------------

/// A request as the in-test upstream received it.
struct ReceivedRequest {
  std::string method;
  std::string target;
  HeaderList headers;  ///< in wire order, repeated names kept
  std::string body;

  /// Every value of fields named `name` (case-insensitive), in order.
  std::vector<std::string> values(std::string_view name) const;
  /// The first value of `name`, or nullopt.
  std::optional<std::string> value(std::string_view name) const;
};

/// How the in-test upstream answers one request.
struct UpstreamReply {
  unsigned status = 201;
  /// Fields written as given, in order. Content-Length is added unless a framing field is
  /// among them.
  HeaderList headers = {{"Content-Type", "application/json"}};
  /// The body; nullopt: `{"path":"/p","n":N}` where N counts the requests to that path (1 for
  /// the first), so every execution has its own body.
  std::optional<std::string> body;
  /// Waits this long before answering (e.g. longer than a route's request_timeout).
  std::chrono::milliseconds delay{0};
  /// Holds the reply until TestUpstream::release() (then `delay` applies): keeps a request in
  /// flight for as long as the test needs, without a clock.
  bool hold = false;
  /// Reads the request, then resets the connection (SO_LINGER 0) without answering.
  bool reset = false;
};

/// A small HTTP/1.1 upstream on 127.0.0.1 with an OS-chosen port, served by one thread. It
/// answers by path (the target without its query): the n-th request to a path gets the n-th
/// reply scripted for it, the last one repeating; unscripted paths get UpstreamReply{}. It
/// records every request it read.
///
/// @par Thread Safety
/// All members may be called from any thread.
class TestUpstream {
 public:
  TestUpstream();
  ~TestUpstream();
  TestUpstream(const TestUpstream&) = delete;
  TestUpstream& operator=(const TestUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  /// `127.0.0.1:PORT`, as a gateway upstream server.
  std::string address() const;

  /// Scripts the replies for `path` and restarts its reply sequence.
  void on(const std::string& path, std::vector<UpstreamReply> replies);

  /// Requests received for `path`, in arrival order.
  std::vector<ReceivedRequest> received(const std::string& path) const;
  /// How many requests arrived for `path`.
  std::size_t count(const std::string& path) const;
  /// How many requests arrived in total.
  std::size_t total() const;
  /// Waits until at least `n` requests arrived for `path`; false after kEventDeadline.
  bool wait_for(const std::string& path, std::size_t n) const;
  /// Lets every held reply (UpstreamReply::hold) go, and every later one pass without holding.
  void release();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
};

// ---------------------------------------------------------------------------------------------

/// One entry of `upstreams:`.
struct UpstreamConfig {
  std::string name;
  std::vector<std::string> servers;  ///< "127.0.0.1:PORT"
  std::string connect_timeout = "1s";
  std::string request_timeout = "20s";
  /// `max_idle_connections`; nullopt: not written, the default.
  std::optional<int> max_idle_connections{};
  /// Further `key: value` lines of the upstream's mapping (e.g. `idle_timeout: 60s`), as given.
  std::vector<std::string> extra{};
};

/// One entry of `routes:`, built from the parameters tests vary.
struct RouteConfig {
  std::string name;
  std::string path_prefix;
  std::string upstream;
  std::vector<std::string> match_methods;  ///< empty: every method
  std::string mode = "off";                ///< off | optional | required
  std::vector<std::string> methods;        ///< idempotency.methods; empty: the default
  std::vector<std::string> key_scope_headers;
  /// Further `key: value` lines of the `idempotency` mapping, written as given.
  std::vector<std::string> extra;
  /// Further `key: value` lines of the route itself (e.g. `max_in_flight: 8`), written as given.
  std::vector<std::string> route_extra{};
};

/// A gateway configuration (SPEC §2). Listen and admin ports are 0 (the OS chooses; the
/// fixture reads the bound port from the `listening` log line); storage comes from
/// IDEMGATE_PG_DSN (unless postgres_dsn is set) and IDEMGATE_REDIS_ADDR.
struct GatewayConfig {
  std::vector<UpstreamConfig> upstreams;
  std::vector<RouteConfig> routes;
  /// When not empty, the YAML list under `routes:` as text, used instead of `routes`.
  std::string routes_yaml;
  /// The flow mapping of `limits`.
  std::string limits = "{ max_request_body: 1MiB, drain_timeout: 2s }";
  int threads = 2;
  /// `storage.postgres.operation_timeout` and `storage.redis.operation_timeout` (SPEC C25).
  std::string postgres_operation_timeout = "2s";
  /// `storage.postgres.dsn`; empty: IDEMGATE_PG_DSN (e.g. a PgBouncer in front of it, C44).
  std::string postgres_dsn;
  /// `storage.postgres.pool_size` (connections per gateway process).
  int postgres_pool_size = 4;
  /// `storage.postgres.prepared_statements` (SPEC C44); nullopt: not written, the default.
  std::optional<bool> prepared_statements;
  /// Further entries of the `storage.postgres` flow mapping (e.g. `max_pending: 8`); empty: none.
  std::string postgres_extra;
  std::string redis_operation_timeout = "500ms";
  /// Entries of the `storage.redis` flow mapping other than operation_timeout (e.g.
  /// `sentinels: ["127.0.0.1:26379"], master_name: m`); empty: address and port from
  /// IDEMGATE_REDIS_ADDR.
  std::string redis;
  /// The flow mapping of `storage.cleanup` (e.g. `{ interval: 1s, batch: 2 }`); empty: not
  /// written, the defaults apply (SPEC C24).
  std::string cleanup;
  /// The flow mapping of `request_id` (e.g. `{ generate: false }`); empty: not written, the
  /// defaults apply.
  std::string request_id;

  /// The YAML text. Throws std::runtime_error when a store variable is missing.
  std::string render() const;
};

/// How each gateway process is started, besides its configuration.
struct GatewayProcess {
  /// RLIMIT_NOFILE of the process (soft and hard); nullopt: inherited (SPEC C52).
  std::optional<unsigned long> open_files_limit;
  /// Environment entries set on top of the test's own (e.g. sanitizer options).
  std::vector<std::pair<std::string, std::string>> env;
};

/// One or more `idemgate --config F` processes sharing one configuration file and the stores,
/// each with its stderr in its own file. Every instance listens when the constructor returns;
/// the destructor stops them by PID and, when the current test has failed, logs the tail of
/// each one's stderr.
class Gateway {
 public:
  explicit Gateway(const GatewayConfig& config, int instances = 1,
                   const GatewayProcess& process = {});
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  int instances() const { return static_cast<int>(children_.size()); }
  /// The configuration file every instance runs with, and the directory it lives in.
  const std::string& config_path() const { return config_path_; }
  const std::filesystem::path& dir() const { return dir_.path(); }
  std::uint16_t port(int instance = 0) const { return ports_.at(instance); }
  /// The process id of `instance` (e.g. to read /proc/PID/status); -1 once it was reaped.
  pid_t pid(int instance = 0) const { return children_.at(instance)->pid(); }
  /// The admin port of `instance`, from its `admin listening` log line (waited for up to
  /// kEventDeadline). Throws std::runtime_error with the diagnostics when there is none.
  std::uint16_t admin_port(int instance = 0) const;
  /// GET `path` (e.g. `/metrics`) on the admin port of `instance`.
  HttpResponse admin_get(const std::string& path, int instance = 0) const;
  std::string stderr_text(int instance = 0) const;
  std::string stderr_tail(int instance = 0) const;
  /// The stderr tails of every instance, labelled, for failure messages.
  std::string diagnostics() const;
  /// describe(response) followed by diagnostics().
  std::string explain(const HttpResponse& response) const;

  /// Sends `request` on a fresh connection to `instance`.
  HttpResponse send(const HttpRequest& request, int instance = 0) const;
  /// A kept-alive connection to `instance`.
  std::unique_ptr<HttpConnection> connect(int instance = 0) const;
  /// Stops `instance` (SIGTERM, then SIGKILL) and returns its exit status.
  int stop(int instance = 0);
  /// Sends `signo` to `instance` (e.g. SIGKILL: a gateway that dies mid-request, SPEC C23).
  void signal(int signo, int instance = 0);
  /// Waits up to `timeout` for `instance` to exit on its own (after a SIGTERM's drain); its exit
  /// status, or nullopt while it still runs.
  std::optional<int> wait_for_exit(std::chrono::milliseconds timeout, int instance = 0);

 private:
  TempDir dir_;
  std::string config_path_;
  std::vector<std::string> stderr_paths_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::vector<std::uint16_t> ports_;
};

/// How a run of the `idemgate` binary as a command-line tool ended.
struct CliResult {
  int status = -1;  ///< exit status (the stop's status when it ran past kEventDeadline)
  std::string out;
  std::string err;
};

/// Runs `executable` with `args` (no PATH search), its output in files under `dir`, and waits
/// for it (kEventDeadline at most): a real client (curl, nghttp) or the gateway as a CLI.
CliResult run_program(const std::string& executable, std::vector<std::string> args,
                      const std::filesystem::path& dir);

/// Runs `idemgate keys ACTION --config CONFIG REST…` (`args` is ACTION followed by REST), its
/// output in files under `dir`, and waits for it (kEventDeadline at most).
CliResult run_keys(const std::string& config_path, const std::filesystem::path& dir,
                   std::vector<std::string> args);

/// A POST with `Content-Type: application/json` and, when `key` is given, `Idempotency-Key: key`
/// (the raw field value); `extra` fields follow in order.
HttpRequest keyed_post(const std::string& target, const std::optional<std::string>& key,
                       const std::string& body, HeaderList extra = {});

/// What one concurrent request ended with: a response, or the exception text.
struct ConcurrentResult {
  HttpResponse response;
  std::string error;
};

/// Runs `send(i)` for i in [0, n) on n threads at once (released together once all are ready);
/// `send` should open its own connection. Returns the results by index.
std::vector<ConcurrentResult> run_concurrently(
    std::size_t n, const std::function<HttpResponse(std::size_t)>& send);

// ---------------------------------------------------------------------------------------------

/// A libpq connection for looking at tables directly. Throws std::runtime_error on failure.
class Database {
 public:
  explicit Database(const std::string& dsn);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  /// The first row of the result as text columns (NULL as ""), or nullopt for no row.
  std::optional<std::vector<std::string>> row(const std::string& sql,
                                              const std::vector<std::string>& params = {});
  /// The first column of the first row ("" for no row).
  std::string scalar(const std::string& sql, const std::vector<std::string>& params = {});

 private:
  ::pg_conn* conn_;
};

/// A synchronous Redis connection (hiredis) to IDEMGATE_REDIS_ADDR for inspecting and
/// disturbing the gateway's locks. Throws std::runtime_error on failure.
class RedisClient {
 public:
  RedisClient();
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  bool exists(const std::string& key);
  /// Deletes `key`; returns how many keys were removed.
  long long del(const std::string& key);
  /// The string value of `key`; nullopt when it does not exist.
  std::optional<std::string> get(const std::string& key);
  /// Waits until `key` holds a committed marker (SPEC C23: written just after the answer);
  /// false after kEventDeadline.
  bool wait_for_marker(const std::string& key);

 private:
  ::redisContext* context_;
};

/// Hex of the record id the gateway derives for `key` on route `route` whose key_scope headers
/// carried `scope_values` (one list of values per configured header, SPEC §4). This is the
/// primary key of `idempotency_record` (as bytea) and the suffix of the Redis lock key.
std::string record_id_hex(
    const std::string& route, const std::string& key,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& scope_values = {});

/// The Idempotency-Key value the upstream receives with `upstream_key: rewrite` under `secret`
/// (SPEC C14) for `key` on route `route` with key_scope values `scope_values` (as in
/// record_id_hex). Computed by the gateway's own function, whose output
/// tests/data/vectors/upstream_key_rewrite.json pins.
std::string rewritten_key(
    const std::string& secret, const std::string& route, const std::string& key,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& scope_values = {});

/// The Redis key of the in-flight lock for a record id (SPEC C23).
std::string lock_key(const std::string& record_id_hex);

}  // namespace idemgate::test::e2e
