// Opens N keep-alive connections to an HTTP server, sends one GET on each, reads the answer and
// then holds every connection open and idle until stdin closes (S5 of scripts/bench).
//
//   idle_connections --host 127.0.0.1 --port P --connections N [--path /]
//
// Prints `ready N` once every connection has its answer (`ready` counts only those that got
// one), then `closed K` (connections the server closed meanwhile) when stdin reaches EOF.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/program_options.hpp>
#include <cctype>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench/tool_support.hpp"
#include "gateway/common/use_nothrow.hpp"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using idemgate::common::use_nothrow;

struct Counts {
  int target = 0;
  int answered = 0;
  int finished = 0;  // answered or failed
  int closed = 0;
};

void report_ready(Counts& counts) {
  if (counts.finished == counts.target) {
    std::printf("ready %d\n", counts.answered);
    std::fflush(stdout);
  }
}

// One connection: a GET with keep-alive, its whole answer (Content-Length framing), then a read
// that only ends when the server closes the connection.
asio::awaitable<void> hold(tcp::endpoint endpoint, std::string request, Counts* counts) {
  tcp::socket socket(co_await asio::this_coro::executor);
  auto [ec] = co_await socket.async_connect(endpoint, use_nothrow);
  bool answered = false;
  if (!ec) {
    auto [wec, written] = co_await asio::async_write(socket, asio::buffer(request), use_nothrow);
    asio::streambuf in;
    std::size_t header_end = 0;
    if (!wec) {
      auto [rec, n] = co_await asio::async_read_until(socket, in, "\r\n\r\n", use_nothrow);
      header_end = rec ? 0 : n;
    }
    if (header_end > 0) {
      std::string head(asio::buffers_begin(in.data()),
                       asio::buffers_begin(in.data()) + static_cast<std::ptrdiff_t>(header_end));
      std::size_t length = 0;
      for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (auto at = head.find("content-length:"); at != std::string::npos) {
        length = std::stoul(head.substr(at + 15));
      }
      in.consume(header_end);
      std::size_t have = in.size();
      if (have < length) {
        auto [bec, m] = co_await asio::async_read(socket, in, asio::transfer_exactly(length - have),
                                                  use_nothrow);
        answered = !bec;
      } else {
        answered = true;
      }
    }
  }
  counts->answered += answered ? 1 : 0;
  ++counts->finished;
  report_ready(*counts);
  if (!answered) co_return;
  char byte;
  // Any outcome (EOF, reset, or an unexpected byte) means the server did not keep it idle.
  co_await socket.async_read_some(asio::buffer(&byte, 1), use_nothrow);
  ++counts->closed;
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  int connections = 1000;
  std::string path = "/";
  po::options_description options("idle_connections");
  options.add_options()("host", po::value(&host))("port", po::value(&port)->required())(
      "connections", po::value(&connections))("path", po::value(&path));
  if (!idemgate::bench::parse_options(argc, argv, options)) return 2;

  asio::io_context io;
  Counts counts;
  counts.target = connections;
  const tcp::endpoint endpoint(asio::ip::make_address(host), port);
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: keep-alive\r\n\r\n";
  for (int i = 0; i < connections; ++i) {
    asio::co_spawn(io, hold(endpoint, request, &counts), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
  // EOF on stdin ends the run: every socket is closed with the io_context.
  const idemgate::bench::StdinWatch watch(io, [&] {
    std::printf("closed %d\n", counts.closed);
    std::fflush(stdout);
    io.stop();
  });
  io.run();
  return 0;
}
