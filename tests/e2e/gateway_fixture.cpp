#include "tests/e2e/gateway_fixture.hpp"

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json/parse.hpp>
#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "gateway/common/use_nothrow.hpp"
#include "gateway/core/fingerprint.hpp"
#include "gateway/core/hash.hpp"
#include "gateway/core/replay_marker.hpp"

namespace idemgate::test::e2e {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;

using idemgate::common::use_nothrow;

// Neither binary offers an event for "listening" or "counter reached" other than its output
// or an HTTP answer: they are polled at kPollInterval (tests/support/polling.hpp).

std::string yaml_quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string yaml_list(const std::vector<std::string>& items, bool quoted = false) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += quoted ? yaml_quoted(items[i]) : items[i];
  }
  return out + "]";
}

std::pair<std::string, std::string> split_host_port(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    throw std::runtime_error("expected HOST:PORT, got '" + address + "'");
  return {address.substr(0, colon), address.substr(colon + 1)};
}

std::string path_of(std::string_view target) {
  return std::string(target.substr(0, target.find('?')));
}

bool has_field(const HeaderList& headers, std::string_view name) {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return true;
  return false;
}

bool current_test_failed() {
  namespace ut = boost::unit_test;
  if (std::uncaught_exceptions() > 0) return true;
  if (!ut::framework::test_in_progress()) return false;
  const auto id = ut::framework::current_test_case().p_id;
  return ut::results_collector.results(id).p_assertions_failed > 0;
}

}  // namespace

std::string unique_name(std::string_view prefix) {
  static const std::string run = [] {
    std::random_device rd;
    std::ostringstream s;
    s << std::hex << rd() << rd();
    return s.str();
  }();
  static std::atomic<int> counter{0};
  return std::string(prefix) + "-" + run + "-" + std::to_string(++counter);
}

std::string file_tail(const std::string& path, std::size_t lines) {
  std::ifstream in(path, std::ios::binary);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(std::move(line));
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

std::string describe(const HttpResponse& response) {
  std::ostringstream out;
  out << "HTTP " << response.status << "\n";
  for (const auto& [name, value] : response.headers) out << name << ": " << value << "\n";
  constexpr std::size_t kMaxBody = 2000;
  out << "\n" << response.body.substr(0, kMaxBody);
  if (response.body.size() > kMaxBody) out << "… (" << response.body.size() << " bytes)";
  return out.str();
}

boost::test_tools::assertion_result is_problem(const HttpResponse& response, unsigned status) {
  boost::test_tools::assertion_result result(false);
  const auto fail = [&](const std::string& why) {
    result.message() << why << "; response:\n" << describe(response);
    return result;
  };
  if (response.status != status)
    return fail("status " + std::to_string(response.status) + ", expected " +
                std::to_string(status));
  if (response.header("Content-Type").value_or("") != "application/problem+json")
    return fail("Content-Type is not application/problem+json");
  json::error_code ec;
  const json::value body = json::parse(response.body, ec);
  if (ec || !body.is_object()) return fail("the body is not a JSON object");
  const json::object& problem = body.as_object();
  for (const char* member : {"type", "title", "detail"}) {
    const auto* v = problem.if_contains(member);
    if (!v || !v->is_string() || v->as_string().empty())
      return fail(std::string("member '") + member + "' is missing or not a non-empty string");
  }
  const auto* s = problem.if_contains("status");
  if (!s || !s->is_number() || s->to_number<unsigned>() != status)
    return fail("member 'status' does not equal the HTTP status");
  return true;
}

std::string problem_type(const HttpResponse& response) {
  json::error_code ec;
  const json::value body = json::parse(response.body, ec);
  if (ec || !body.is_object()) return "";
  const auto* type = body.as_object().if_contains("type");
  return type && type->is_string() ? std::string(type->as_string()) : "";
}

TempDir::TempDir() {
  path_ = std::filesystem::temp_directory_path() / unique_name("idemgate-e2e");
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

CliResult run_keys(const std::string& config_path, const std::filesystem::path& dir,
                   std::vector<std::string> args) {
  std::vector<std::string> full = {"keys"};
  full.insert(full.end(), args.begin(), args.end());
  full.insert(full.begin() + 2, {"--config", config_path});
  return run_program(require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate", std::move(full),
                     dir);
}

CliResult run_program(const std::string& executable, std::vector<std::string> args,
                      const std::filesystem::path& dir) {
  ChildOptions o;
  o.executable = executable;
  o.args = std::move(args);
  const std::string name = unique_name("run");
  o.stdout_path = (dir / (name + ".out")).string();
  o.stderr_path = (dir / (name + ".err")).string();
  ChildProcess child(o);
  CliResult result;
  const auto status =
      child.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(kEventDeadline));
  result.status = status ? *status : child.stop();
  result.out = read_text_file(o.stdout_path);
  result.err = read_text_file(o.stderr_path);
  return result;
}

std::optional<std::uint16_t> logged_port(const std::string& stderr_path, const std::string& msg) {
  std::ifstream in(stderr_path);
  std::string line;
  while (std::getline(in, line)) {
    json::error_code ec;
    const json::value v = json::parse(line, ec);
    if (ec || !v.is_object()) continue;
    const auto* m = v.as_object().if_contains("msg");
    const auto* port = v.as_object().if_contains("port");
    if (m && m->is_string() && m->as_string() == msg && port && port->is_number())
      return port->to_number<std::uint16_t>();
  }
  return std::nullopt;
}

std::uint16_t wait_for_listening(ChildProcess& child, const std::string& stderr_path,
                                 const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  for (;;) {
    if (const auto port = logged_port(stderr_path, "listening")) return *port;
    if (!child.running())
      throw std::runtime_error(what + " exited before listening; its stderr:\n" +
                               file_tail(stderr_path));
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error(what + " did not log 'listening' in time; its stderr:\n" +
                               file_tail(stderr_path));
    std::this_thread::sleep_for(kPollInterval);
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

ChildOptions payment_options(const PaymentService::Options& options, const std::string& stderr_path,
                             const std::string& stdout_path) {
  ChildOptions o;
  o.executable = require_env("IDEMGATE_BINARY_DIR") + "/examples/payment-service/payment-service";
  o.args = {"--listen", kLoopback + ":0", "--dsn", require_env("IDEMGATE_PAYMENTS_DSN")};
  if (options.delay_ms > 0) {
    o.args.push_back("--delay-ms");
    o.args.push_back(std::to_string(options.delay_ms));
  }
  if (options.keep_alive_timeout_s > 0) {
    o.args.push_back("--keep-alive-timeout");
    o.args.push_back(std::to_string(options.keep_alive_timeout_s));
  }
  o.stderr_path = stderr_path;
  o.stdout_path = stdout_path;
  return o;
}

}  // namespace

PaymentService::PaymentService(Options options)
    : stderr_path_((dir_.path() / "payment-service.log").string()),
      child_(
          payment_options(options, stderr_path_, (dir_.path() / "payment-service.out").string())) {
  port_ = wait_for_listening(child_, stderr_path_, "payment-service");
  const HttpResponse health = http_request(kLoopback, port_, {"GET", "/healthz", {}, ""});
  if (health.status != 200)
    throw std::runtime_error("payment-service /healthz answered " + describe(health));
}

PaymentService::~PaymentService() {
  child_.stop();
  if (current_test_failed()) BOOST_TEST_MESSAGE("payment-service stderr tail:\n" << stderr_tail());
}

std::string PaymentService::address() const {
  return kLoopback + ":" + std::to_string(port_);
}

json::object PaymentService::stats() const {
  const HttpResponse res = http_request(kLoopback, port_, {"GET", "/stats", {}, ""});
  if (res.status != 200) throw std::runtime_error("payment-service /stats: " + describe(res));
  return json::parse(res.body).as_object();
}

std::uint64_t PaymentService::counter(const char* name) const {
  return stats().at(name).to_number<std::uint64_t>();
}

bool PaymentService::wait_for_counter(const char* name, std::uint64_t value) const {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  while (counter(name) < value) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

std::string payment_body(const std::string& external_id, const std::string& amount,
                         const std::string& provider) {
  return R"({"order_id":"order-1","customer_id":"customer-1","provider":")" + provider +
         R"(","external_payment_id":")" + external_id + R"(","amount":")" + amount + "\"}";
}

// ---------------------------------------------------------------------------------------------

namespace {

ChildOptions stream_upstream_options(const std::string& stderr_path,
                                     const std::string& stdout_path) {
  ChildOptions o;
  o.executable = require_env("IDEMGATE_BINARY_DIR") + "/tests/stream-upstream";
  o.args = {"--listen", kLoopback + ":0"};
  o.stderr_path = stderr_path;
  o.stdout_path = stdout_path;
  return o;
}

}  // namespace

StreamUpstream::StreamUpstream()
    : stderr_path_((dir_.path() / "stream-upstream.log").string()),
      child_(
          stream_upstream_options(stderr_path_, (dir_.path() / "stream-upstream.out").string())) {
  port_ = wait_for_listening(child_, stderr_path_, "stream-upstream");
}

StreamUpstream::~StreamUpstream() {
  child_.stop();
  if (current_test_failed()) BOOST_TEST_MESSAGE("stream-upstream stderr tail:\n" << stderr_tail());
}

std::string StreamUpstream::address() const {
  return kLoopback + ":" + std::to_string(port_);
}

json::object StreamUpstream::stats() const {
  const HttpResponse res = http_request(kLoopback, port_, {"GET", "/stats", {}, ""});
  if (res.status != 200) throw std::runtime_error("stream-upstream /stats: " + describe(res));
  return json::parse(res.body).as_object();
}

std::uint64_t StreamUpstream::counter(const char* name) const {
  return stats().at(name).to_number<std::uint64_t>();
}

bool StreamUpstream::wait_for_counter(const char* name, std::uint64_t value) const {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  while (counter(name) < value) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

bool StreamUpstream::wait_for_counter_equal(const char* name, std::uint64_t value) const {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  while (counter(name) != value) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------

std::vector<std::string> ReceivedRequest::values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) out.push_back(value);
  return out;
}

std::optional<std::string> ReceivedRequest::value(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return value;
  return std::nullopt;
}

struct TestUpstream::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::address_v4::loopback(), 0)};
  std::thread thread;

  mutable std::mutex mutex;
  mutable std::condition_variable arrived;
  std::map<std::string, std::vector<UpstreamReply>> scripts;
  std::map<std::string, std::size_t> counts;  // requests per path since its script was set
  std::map<std::string, std::size_t> totals;  // requests per path since start
  std::vector<ReceivedRequest> requests;
  bool released = false;                   // io thread only
  std::vector<asio::steady_timer*> holds;  // io thread only

  ~Impl() {
    io.stop();
    if (thread.joinable()) thread.join();
  }

  // Records the request and picks its reply; the second member is the request's number on
  // its path.
  std::pair<UpstreamReply, std::size_t> record(const bhttp::request<bhttp::string_body>& req) {
    ReceivedRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    for (const auto& f : req) r.headers.emplace_back(f.name_string(), f.value());
    r.body = req.body();
    const std::string path = path_of(r.target);
    std::pair<UpstreamReply, std::size_t> out;
    {
      std::lock_guard lock(mutex);
      const std::size_t index = counts[path]++;
      out.second = ++totals[path];
      if (const auto it = scripts.find(path); it != scripts.end() && !it->second.empty())
        out.first = it->second[std::min(index, it->second.size() - 1)];
      requests.push_back(std::move(r));
    }
    arrived.notify_all();
    return out;
  }

  static std::string render(const UpstreamReply& reply, const std::string& path, std::size_t n) {
    const bool bodiless = reply.status / 100 == 1 || reply.status == 204 || reply.status == 304;
    const std::string body =
        bodiless
            ? ""
            : reply.body.value_or(R"({"path":")" + path + R"(","n":)" + std::to_string(n) + "}");
    std::string raw =
        "HTTP/1.1 " + std::to_string(reply.status) + " " +
        std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(reply.status))) + "\r\n";
    for (const auto& [name, value] : reply.headers) raw += name + ": " + value + "\r\n";
    if (!bodiless && !has_field(reply.headers, "Content-Length") &&
        !has_field(reply.headers, "Transfer-Encoding"))
      raw += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    return raw + "\r\n" + body;
  }

  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(use_nothrow);
      if (ec) co_return;
      asio::co_spawn(io, serve(std::move(socket)), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
    }
  }

  asio::awaitable<void> serve(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    for (;;) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(1024 * 1024);
      parser.body_limit(64 * 1024 * 1024);
      auto [ec, n] = co_await bhttp::async_read(stream, buffer, parser, use_nothrow);
      if (ec) co_return;
      const auto req = parser.release();
      const auto [reply, number] = record(req);
      if (reply.hold && !released) {
        asio::steady_timer hold(io, asio::steady_timer::time_point::max());
        holds.push_back(&hold);
        co_await hold.async_wait(use_nothrow);
        std::erase(holds, &hold);
      }
      if (reply.delay.count() > 0) {
        asio::steady_timer timer(io, reply.delay);
        co_await timer.async_wait(use_nothrow);
      }
      boost::system::error_code ignored;
      if (reply.reset) {
        stream.socket().set_option(tcp::socket::linger(true, 0), ignored);
        stream.socket().close(ignored);
        co_return;
      }
      const std::string raw = render(reply, path_of(req.target()), number);
      auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(raw), use_nothrow);
      if (wec || !req.keep_alive()) {
        stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
        co_return;
      }
    }
  }
};

TestUpstream::TestUpstream() : impl_(std::make_unique<Impl>()) {
  port_ = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->accept_loop(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

TestUpstream::~TestUpstream() = default;

std::string TestUpstream::address() const {
  return kLoopback + ":" + std::to_string(port_);
}

void TestUpstream::on(const std::string& path, std::vector<UpstreamReply> replies) {
  std::lock_guard lock(impl_->mutex);
  impl_->scripts[path] = std::move(replies);
  impl_->counts[path] = 0;
}

std::vector<ReceivedRequest> TestUpstream::received(const std::string& path) const {
  std::lock_guard lock(impl_->mutex);
  std::vector<ReceivedRequest> out;
  for (const auto& r : impl_->requests)
    if (path_of(r.target) == path) out.push_back(r);
  return out;
}

std::size_t TestUpstream::count(const std::string& path) const {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->totals.find(path);
  return it == impl_->totals.end() ? 0 : it->second;
}

std::size_t TestUpstream::total() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->requests.size();
}

bool TestUpstream::wait_for(const std::string& path, std::size_t n) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->arrived.wait_for(lock, kEventDeadline, [&] {
    const auto it = impl_->totals.find(path);
    return it != impl_->totals.end() && it->second >= n;
  });
}

void TestUpstream::release() {
  asio::post(impl_->io, [impl = impl_.get()] {
    impl->released = true;
    for (auto* hold : impl->holds) hold->cancel();
  });
}

// ---------------------------------------------------------------------------------------------

std::string GatewayConfig::render() const {
  std::ostringstream y;
  y << "listen: { address: " << kLoopback << ", port: 0 }\n"
    << "admin: { address: " << kLoopback << ", port: 0 }\n"
    << "threads: " << threads << "\n"
    << "limits: " << limits << "\n";
  if (!request_id.empty()) y << "request_id: " << request_id << "\n";
  y << "storage:\n"
    << "  postgres: { dsn: "
    << yaml_quoted(postgres_dsn.empty() ? require_env("IDEMGATE_PG_DSN") : postgres_dsn)
    << ", pool_size: " << postgres_pool_size
    << ", operation_timeout: " << postgres_operation_timeout;
  if (prepared_statements)
    y << ", prepared_statements: " << (*prepared_statements ? "true" : "false");
  if (!postgres_extra.empty()) y << ", " << postgres_extra;
  y << " }\n"
    << "  redis: { ";
  if (redis.empty()) {
    const auto [redis_host, redis_port] = split_host_port(require_env("IDEMGATE_REDIS_ADDR"));
    y << "address: " << redis_host << ", port: " << redis_port;
  } else {
    y << redis;
  }
  y << ", operation_timeout: " << redis_operation_timeout << " }\n";
  if (!cleanup.empty()) y << "  cleanup: " << cleanup << "\n";
  y << "upstreams:\n";
  for (const auto& u : upstreams) {
    y << "  " << u.name << ":\n"
      << "    servers: " << yaml_list(u.servers, true) << "\n"
      << "    connect_timeout: " << u.connect_timeout << "\n"
      << "    request_timeout: " << u.request_timeout << "\n";
    if (u.max_idle_connections)
      y << "    max_idle_connections: " << *u.max_idle_connections << "\n";
    for (const auto& line : u.extra) y << "    " << line << "\n";
  }
  y << "routes:\n";
  if (!routes_yaml.empty()) {
    y << routes_yaml;
    if (routes_yaml.back() != '\n') y << "\n";
    return y.str();
  }
  for (const auto& r : routes) {
    y << "  - name: " << r.name << "\n"
      << "    match: { path_prefix: " << r.path_prefix;
    if (!r.match_methods.empty()) y << ", methods: " << yaml_list(r.match_methods);
    y << " }\n"
      << "    upstream: " << r.upstream << "\n"
      << "    idempotency:\n"
      << "      mode: " << r.mode << "\n";
    if (!r.methods.empty()) y << "      methods: " << yaml_list(r.methods) << "\n";
    if (!r.key_scope_headers.empty())
      y << "      key_scope: { headers: " << yaml_list(r.key_scope_headers) << " }\n";
    for (const auto& line : r.extra) y << "      " << line << "\n";
    for (const auto& line : r.route_extra) y << "    " << line << "\n";
  }
  return y.str();
}

Gateway::Gateway(const GatewayConfig& config, int instances, const GatewayProcess& process)
    : config_path_((dir_.path() / "gateway.yaml").string()) {
  {
    std::ofstream out(config_path_);
    out << config.render();
    if (!out) throw std::runtime_error("cannot write " + config_path_);
  }
  const std::string binary = require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  // All instances start before any is awaited, so that they start (and migrate) together.
  for (int i = 0; i < instances; ++i) {
    ChildOptions o;
    o.executable = binary;
    o.args = {"--config", config_path_};
    o.env = process.env;
    o.open_files_limit = process.open_files_limit;
    o.stderr_path = (dir_.path() / ("idemgate-" + std::to_string(i) + ".log")).string();
    o.stdout_path = (dir_.path() / ("idemgate-" + std::to_string(i) + ".out")).string();
    stderr_paths_.push_back(o.stderr_path);
    children_.push_back(std::make_unique<ChildProcess>(o));
  }
  for (int i = 0; i < instances; ++i) {
    ports_.push_back(wait_for_listening(
        *children_[i], stderr_paths_[i],
        "idemgate instance " + std::to_string(i) + " (config:\n" + config.render() + ")"));
  }
}

Gateway::~Gateway() {
  for (auto& child : children_) child->stop();
  if (current_test_failed()) BOOST_TEST_MESSAGE("idemgate stderr:\n" << diagnostics());
}

std::uint16_t Gateway::admin_port(int instance) const {
  std::optional<std::uint16_t> port;
  // The admin listener logs before the client listener, which the constructor waited for; the
  // wait only covers a log line still on its way to the file.
  eventually([&] {
    port = logged_port(stderr_paths_.at(instance), "admin listening");
    return port.has_value();
  });
  if (!port) throw std::runtime_error("no 'admin listening' line\n" + diagnostics());
  return *port;
}

HttpResponse Gateway::admin_get(const std::string& path, int instance) const {
  return http_request(kLoopback, admin_port(instance), {"GET", path, {}, ""});
}

std::string Gateway::stderr_text(int instance) const {
  return read_text_file(stderr_paths_.at(instance));
}

std::string Gateway::stderr_tail(int instance) const {
  return file_tail(stderr_paths_.at(instance));
}

std::string Gateway::diagnostics() const {
  std::string out;
  for (int i = 0; i < instances(); ++i)
    out += "--- idemgate instance " + std::to_string(i) + " stderr (tail):\n" + stderr_tail(i);
  return out;
}

std::string Gateway::explain(const HttpResponse& response) const {
  return describe(response) + "\n" + diagnostics();
}

HttpResponse Gateway::send(const HttpRequest& request, int instance) const {
  return http_request(kLoopback, port(instance), request);
}

std::unique_ptr<HttpConnection> Gateway::connect(int instance) const {
  return std::make_unique<HttpConnection>(kLoopback, port(instance));
}

int Gateway::stop(int instance) {
  return children_.at(instance)->stop();
}

std::optional<int> Gateway::wait_for_exit(std::chrono::milliseconds timeout, int instance) {
  return children_.at(instance)->wait_for(timeout);
}

void Gateway::signal(int signo, int instance) {
  children_.at(instance)->signal(signo);
}

HttpRequest keyed_post(const std::string& target, const std::optional<std::string>& key,
                       const std::string& body, HeaderList extra) {
  HttpRequest request;
  request.method = "POST";
  request.target = target;
  request.headers.emplace_back("Content-Type", "application/json");
  if (key) request.headers.emplace_back("Idempotency-Key", *key);
  for (auto& field : extra) request.headers.push_back(std::move(field));
  request.body = body;
  return request;
}

std::vector<ConcurrentResult> run_concurrently(
    std::size_t n, const std::function<HttpResponse(std::size_t)>& send) {
  std::vector<ConcurrentResult> results(n);
  std::latch start(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      try {
        results[i].response = send(i);
      } catch (const std::exception& e) {
        results[i].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// ---------------------------------------------------------------------------------------------

Database::Database(const std::string& dsn) : conn_(PQconnectdb(dsn.c_str())) {
  if (PQstatus(conn_) != CONNECTION_OK) {
    const std::string error = PQerrorMessage(conn_);
    PQfinish(conn_);
    throw std::runtime_error("cannot connect to " + dsn + ": " + error);
  }
}

Database::~Database() {
  PQfinish(conn_);
}

std::optional<std::vector<std::string>> Database::row(const std::string& sql,
                                                      const std::vector<std::string>& params) {
  std::vector<const char*> values;
  for (const auto& p : params) values.push_back(p.c_str());
  std::unique_ptr<PGresult, decltype(&PQclear)> result{
      PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                   nullptr, nullptr, 0),
      &PQclear};
  const auto status = PQresultStatus(result.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK)
    throw std::runtime_error(sql + ": " + PQerrorMessage(conn_));
  if (PQntuples(result.get()) == 0) return std::nullopt;
  std::vector<std::string> columns;
  for (int c = 0; c < PQnfields(result.get()); ++c)
    columns.emplace_back(PQgetvalue(result.get(), 0, c));
  return columns;
}

std::string Database::scalar(const std::string& sql, const std::vector<std::string>& params) {
  const auto r = row(sql, params);
  return r && !r->empty() ? r->front() : "";
}

RedisClient::RedisClient() {
  const auto [host, port] = split_host_port(require_env("IDEMGATE_REDIS_ADDR"));
  context_ = redisConnect(host.c_str(), std::stoi(port));
  if (!context_ || context_->err) {
    const std::string error = context_ ? context_->errstr : "out of memory";
    if (context_) redisFree(context_);
    throw std::runtime_error("cannot connect to Redis at " + host + ":" + port + ": " + error);
  }
}

RedisClient::~RedisClient() {
  redisFree(context_);
}

namespace {

long long integer_reply(redisContext* context, const char* command, const std::string& key) {
  auto* reply =
      static_cast<redisReply*>(redisCommand(context, "%s %b", command, key.data(), key.size()));
  if (!reply) throw std::runtime_error(std::string("Redis ") + command + ": " + context->errstr);
  const bool ok = reply->type == REDIS_REPLY_INTEGER;
  const long long value = ok ? reply->integer : 0;
  const std::string error = reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply";
  freeReplyObject(reply);
  if (!ok) throw std::runtime_error(std::string("Redis ") + command + ": " + error);
  return value;
}

}  // namespace

bool RedisClient::exists(const std::string& key) {
  return integer_reply(context_, "EXISTS", key) > 0;
}

long long RedisClient::del(const std::string& key) {
  return integer_reply(context_, "DEL", key);
}

std::optional<std::string> RedisClient::get(const std::string& key) {
  auto* reply = static_cast<redisReply*>(redisCommand(context_, "GET %b", key.data(), key.size()));
  if (!reply) throw std::runtime_error(std::string("Redis GET: ") + context_->errstr);
  std::optional<std::string> value;
  const int type = reply->type;
  if (type == REDIS_REPLY_STRING) value.emplace(reply->str, reply->len);
  const std::string error = type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply";
  freeReplyObject(reply);
  if (type != REDIS_REPLY_STRING && type != REDIS_REPLY_NIL) {
    throw std::runtime_error("Redis GET: " + error);
  }
  return value;
}

bool RedisClient::wait_for_marker(const std::string& key) {
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  for (;;) {
    const auto value = get(key);
    if (value && core::is_replay_marker(*value)) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

namespace {

core::Sha256 scope_of(
    const std::string& route,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& scope_values) {
  std::vector<core::HeaderValues> headers;
  for (const auto& [name, values] : scope_values) {
    core::HeaderValues h{name, {}};
    for (const auto& v : values) h.values.push_back(v);
    headers.push_back(std::move(h));
  }
  return core::compute_scope(route, headers);
}

}  // namespace

std::string record_id_hex(
    const std::string& route, const std::string& key,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& scope_values) {
  return core::to_hex(core::record_id(scope_of(route, scope_values), key));
}

std::string rewritten_key(
    const std::string& secret, const std::string& route, const std::string& key,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& scope_values) {
  return core::upstream_key_rewrite(secret, scope_of(route, scope_values), key);
}

std::string lock_key(const std::string& record_id_hex) {
  return "idemgate:lock:" + record_id_hex;
}

}  // namespace idemgate::test::e2e
