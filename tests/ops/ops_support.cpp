#include "tests/ops/ops_support.hpp"

#include <signal.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "gateway/common/use_nothrow.hpp"

namespace idemgate::test::ops {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using idemgate::common::use_nothrow;

}  // namespace

OpsGateway::OpsGateway(const std::string& yaml)
    : config_path_((dir_.path() / "gateway.yaml").string()),
      stderr_path_((dir_.path() / "idemgate.log").string()) {
  write_config(yaml);
  ChildOptions o;
  o.executable = require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  o.args = {"--config", config_path_};
  o.stderr_path = stderr_path_;
  o.stdout_path = (dir_.path() / "idemgate.out").string();
  child_ = std::make_unique<ChildProcess>(o);
  port_ = wait_for_listening(*child_, stderr_path_, "idemgate (config:\n" + yaml + ")");
  // The admin listener logs before the client listener does.
  const auto admin = logged_port(stderr_path_, "admin listening");
  if (!admin) throw std::runtime_error("no 'admin listening' line; stderr:\n" + stderr_tail());
  admin_port_ = *admin;
}

OpsGateway::~OpsGateway() {
  child_->stop();
  namespace ut = boost::unit_test;
  // current_test_case_id, not current_test_case: a global fixture's teardown has no test case
  // (the master suite is current; current_test_case() throws there).
  const bool failed =
      std::uncaught_exceptions() > 0 ||
      (ut::framework::test_in_progress() &&
       ut::results_collector.results(ut::framework::current_test_case_id()).p_assertions_failed >
           0);
  if (failed) BOOST_TEST_MESSAGE("idemgate stderr tail:\n" << stderr_tail());
}

void OpsGateway::write_config(const std::string& yaml) const {
  // Written aside and renamed: a reload must never read a half-written file.
  const std::string temp = config_path_ + ".new";
  {
    std::ofstream out(temp);
    out << yaml;
    if (!out) throw std::runtime_error("cannot write " + temp);
  }
  std::filesystem::rename(temp, config_path_);
}

void OpsGateway::signal(int signo) {
  child_->signal(signo);
}

std::size_t OpsGateway::log_count(const std::string& msg) const {
  return test::log_lines(read_text_file(stderr_path_), msg).size();
}

bool OpsGateway::wait_for_log(const std::string& msg, std::size_t count) {
  // A log line offers no event to wait on: the file is polled.
  eventually([&] { return log_count(msg) >= count || !child_->running(); });
  return log_count(msg) >= count;
}

std::optional<int> OpsGateway::wait_exit() {
  return child_->wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(kEventDeadline));
}

HttpResponse OpsGateway::send(const HttpRequest& request) const {
  return http_request(kLoopback, port_, request);
}

HttpResponse OpsGateway::admin_get(const std::string& path) const {
  return http_request(kLoopback, admin_port_, {"GET", path, {}, ""});
}

// ---------------------------------------------------------------------------------------------

TestPki::TestPki() {
  {
    std::ofstream ext(dir_.path() / "server.ext");
    ext << "basicConstraints=CA:FALSE\n"
        << "keyUsage=critical,digitalSignature\n"
        << "extendedKeyUsage=serverAuth\n"
        << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  for (const char* ca : {"ca", "other-ca"}) {
    run("openssl req -x509 " + key + " -keyout " + ca + ".key -out " + ca +
        ".pem -days 2 -subj /CN=idemgate-test-" + ca +
        " -addext basicConstraints=critical,CA:TRUE"
        " -addext keyUsage=critical,keyCertSign,cRLSign");
  }
  run("openssl req " + key + " -keyout server.key -out server.csr -subj /CN=localhost");
  run("openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
      " -out server.pem -days 2 -extfile server.ext");
}

void TestPki::run(const std::string& command) const {
  const auto log = dir_.path() / "openssl.log";
  const std::string line =
      "cd '" + dir_.path().string() + "' && " + command + " >>'" + log.string() + "' 2>&1";
  if (std::system(line.c_str()) != 0) {
    throw std::runtime_error("openssl failed: " + command + "\n" + read_text_file(log.string()));
  }
}

// ---------------------------------------------------------------------------------------------

HttpResponse https_request(std::uint16_t port, const std::string& ca_file,
                           const HttpRequest& request) {
  asio::io_context io;
  asio::ssl::context context(asio::ssl::context::tls_client);
  context.load_verify_file(ca_file);
  context.set_verify_mode(asio::ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(io, context);
  stream.set_verify_callback(asio::ssl::host_name_verification(kLoopback));
  beast::get_lowest_layer(stream).connect(tcp::endpoint(asio::ip::make_address(kLoopback), port));
  stream.handshake(asio::ssl::stream_base::client);

  bhttp::request<bhttp::string_body> req;
  req.method_string(request.method);
  req.target(request.target);
  req.version(11);
  bool has_host = false;
  for (const auto& [name, value] : request.headers) {
    req.insert(name, value);
    has_host = has_host || beast::iequals(name, "Host");
  }
  if (!has_host) req.set(bhttp::field::host, kLoopback + ":" + std::to_string(port));
  req.body() = request.body;
  req.prepare_payload();
  bhttp::write(stream, req);

  beast::flat_buffer buffer;
  bhttp::response<bhttp::string_body> res;
  bhttp::read(stream, buffer, res);
  HttpResponse out;
  out.status = res.result_int();
  out.version = res.version();
  for (const auto& field : res) {
    out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  out.body = res.body();
  out.keep_alive = res.keep_alive();
  boost::system::error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ignored);
  return out;
}

// ---------------------------------------------------------------------------------------------

struct TlsUpstream::Impl {
  asio::io_context io{1};
  asio::ssl::context tls{asio::ssl::context::tls_server};
  tcp::acceptor acceptor{io};
  std::atomic<std::size_t> requests{0};
  std::atomic<std::size_t> failed_handshakes{0};
  std::thread thread;

  asio::awaitable<void> serve(tcp::socket socket) {
    beast::ssl_stream<beast::tcp_stream> stream(beast::tcp_stream(std::move(socket)), tls);
    beast::get_lowest_layer(stream).expires_after(kEventDeadline);
    auto [hec] = co_await stream.async_handshake(asio::ssl::stream_base::server, use_nothrow);
    if (hec) {
      ++failed_handshakes;
      co_return;
    }
    beast::flat_buffer buffer;
    for (;;) {
      bhttp::request<bhttp::string_body> req;
      beast::get_lowest_layer(stream).expires_after(kEventDeadline);
      auto [rec, rn] = co_await bhttp::async_read(stream, buffer, req, use_nothrow);
      if (rec) co_return;
      ++requests;
      bhttp::response<bhttp::string_body> res{bhttp::status::ok, 11};
      res.set(bhttp::field::content_type, "application/json");
      res.body() = "{\"tls\":true,\"path\":\"" + std::string(req.target()) + "\"}";
      res.keep_alive(req.keep_alive());
      res.prepare_payload();
      auto [wec, wn] = co_await bhttp::async_write(stream, res, use_nothrow);
      if (wec || !req.keep_alive()) co_return;
    }
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
};

TlsUpstream::TlsUpstream(const std::string& cert_file, const std::string& key_file)
    : impl_(std::make_unique<Impl>()) {
  impl_->tls.use_certificate_chain_file(cert_file);
  impl_->tls.use_private_key_file(key_file, asio::ssl::context::pem);
  const tcp::endpoint endpoint(asio::ip::make_address(kLoopback), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->accept_loop(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

TlsUpstream::~TlsUpstream() {
  impl_->io.stop();
  impl_->thread.join();
}

std::size_t TlsUpstream::requests() const {
  return impl_->requests.load();
}

std::size_t TlsUpstream::failed_handshakes() const {
  return impl_->failed_handshakes.load();
}

}  // namespace idemgate::test::ops
