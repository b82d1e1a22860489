#include "tests/support/http_client.hpp"

#include <poll.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <cerrno>

namespace idemgate::test {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

bool has_field(const HeaderList& headers, std::string_view name) {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return true;
  return false;
}

}  // namespace

std::optional<std::string> HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return value;
  return std::nullopt;
}

std::vector<std::string> HttpResponse::header_values(std::string_view name) const {
  std::vector<std::string> values;
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) values.push_back(value);
  return values;
}

std::size_t HttpResponse::header_count(std::string_view name) const {
  return header_values(name).size();
}

HttpConnection::HttpConnection(std::string host, std::uint16_t port,
                               std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout), stream_(io_) {
  const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(host_), port_);
  run([&](beast::error_code& ec, auto done) {
    stream_.async_connect(endpoint, [&ec, done](beast::error_code e) {
      ec = e;
      done();
    });
  });
}

// Runs one asynchronous operation to completion on the private io_context, so that
// tcp_stream's expiry gives every blocking call a timeout.
template <class Op>
void HttpConnection::run(Op op) {
  beast::error_code ec;
  bool finished = false;
  stream_.expires_after(timeout_);
  io_.restart();
  op(ec, [&finished] { finished = true; });
  io_.run();
  if (!finished) ec = asio::error::operation_aborted;
  if (ec) {
    close();
    throw boost::system::system_error(ec);
  }
}

HttpResponse HttpConnection::request(const HttpRequest& req) {
  send(req);
  return read_response(req.method == "HEAD");
}

void HttpConnection::send(const HttpRequest& req) {
  http::request<http::string_body> message;
  message.method_string(req.method);
  message.target(req.target);
  message.version(req.version);
  if (!has_field(req.headers, "Host"))
    message.set(http::field::host, host_ + ':' + std::to_string(port_));
  for (const auto& [name, value] : req.headers) message.insert(name, value);
  message.body() = req.body;
  const bool framed =
      has_field(req.headers, "Content-Length") || has_field(req.headers, "Transfer-Encoding");
  if (!framed &&
      (!req.body.empty() || req.method == "POST" || req.method == "PUT" || req.method == "PATCH"))
    message.content_length(req.body.size());

  run([&](beast::error_code& ec, auto done) {
    http::async_write(stream_, message, [&ec, done](beast::error_code e, std::size_t) {
      ec = e;
      done();
    });
  });
}

void HttpConnection::send_raw(std::string_view bytes) {
  run([&](beast::error_code& ec, auto done) {
    asio::async_write(stream_, asio::buffer(bytes.data(), bytes.size()),
                      [&ec, done](beast::error_code e, std::size_t) {
                        ec = e;
                        done();
                      });
  });
}

HttpResponse HttpConnection::read_response(bool head) {
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{1} << 30);
  parser.skip(head);
  run([&](beast::error_code& ec, auto done) {
    http::async_read(stream_, buffer_, parser, [&ec, done](beast::error_code e, std::size_t) {
      ec = e;
      done();
    });
  });

  auto& message = parser.get();
  HttpResponse response;
  response.status = message.result_int();
  response.version = message.version();
  for (const auto& field : message)
    response.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  response.body = std::move(message.body());
  response.keep_alive = message.keep_alive();
  if (!response.keep_alive) close();
  return response;
}

bool HttpConnection::readable_within(std::chrono::milliseconds wait) {
  if (buffer_.size() > 0) return true;
  // poll() reports POLLIN for data and for the peer's FIN, POLLHUP/POLLERR for a reset.
  pollfd fd{stream_.socket().native_handle(), POLLIN, 0};
  int ready = -1;
  do {
    ready = ::poll(&fd, 1, static_cast<int>(wait.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) throw boost::system::system_error(errno, boost::system::system_category());
  return ready > 0;
}

bool HttpConnection::wait_closed_by_peer() {
  if (buffer_.size() > 0) return false;
  char byte = 0;
  beast::error_code result;
  bool finished = false;
  stream_.expires_after(timeout_);
  io_.restart();
  stream_.async_read_some(asio::buffer(&byte, 1), [&](beast::error_code e, std::size_t) {
    result = e;
    finished = true;
  });
  io_.run();
  const bool closed =
      finished && (result == asio::error::eof || result == asio::error::connection_reset);
  close();
  return closed;
}

bool HttpConnection::is_open() const {
  return stream_.socket().is_open();
}

void HttpConnection::close() {
  beast::error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

std::uint16_t HttpConnection::local_port() const {
  beast::error_code ec;
  return stream_.socket().local_endpoint(ec).port();
}

HttpResponse http_request(const std::string& host, std::uint16_t port, const HttpRequest& request,
                          std::chrono::milliseconds timeout) {
  HttpConnection connection(host, port, timeout);
  HttpResponse response = connection.request(request);
  connection.close();
  return response;
}

}  // namespace idemgate::test
