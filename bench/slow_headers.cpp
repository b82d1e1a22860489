// Keeps N connections to an HTTP server open, each sending the header of a request one byte per
// interval and never finishing it (slowloris; S10 of scripts/bench, SPEC C54). A connection the
// server closes is counted with how long it lived and replaced by a new one, so that N stay open
// until stdin closes. One ticker sends the bytes of every connection, a hundredth of them every
// hundredth of the interval (each connection its byte per interval), so that the tool itself
// costs a write per byte and no timer per connection: on a machine it shares with the server
// under test, its own cost should count as little as it can.
//
//   slow_headers --host 127.0.0.1 --port P --connections N [--interval-ms 1000]
//                [--max-connecting 256]
//
// Prints `ready N` once N connections are open (at most --max-connecting connect at a time, so
// the server's listen backlog does not overflow), then, when stdin reaches EOF, one line
// `cut=K lived_ms_min=… lived_ms_p50=… lived_ms_p99=… lived_ms_max=… open=M refused=R`: K
// connections the server closed, how long they had lived, the connections open at the end, and
// connects that failed.
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/tool_support.hpp"
#include "gateway/common/use_nothrow.hpp"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using idemgate::common::use_nothrow;

struct Run {
  explicit Run(asio::io_context& io) : connect_slot(io, asio::steady_timer::time_point::max()) {}
  tcp::endpoint endpoint;
  std::string header;  // its first bytes; never ends with the blank line
  std::chrono::milliseconds interval{1000};
  int target = 0;
  int max_connecting = 256;
  int connecting = 0;
  // Never expires: a slot waiting to connect waits on it, and a finished connect wakes one
  // waiter (cancel_one), so that waiting costs nothing while 10 000 slots start.
  asio::steady_timer connect_slot;
  int open = 0;
  int refused = 0;
  // Per slot: its connection while it is open (null otherwise) and the header bytes it sent.
  std::vector<tcp::socket*> sockets;
  std::vector<std::size_t> sent;
  bool ready_reported = false;
  std::vector<double> lived_ms;  // of the connections the server closed
};

// The header's byte `i`: the request line and Host field, then the value of X-Slow forever.
char header_byte(const Run& run, std::size_t i) {
  return i < run.header.size() ? run.header[i] : 'x';
}

constexpr int kPhases = 100;  // the ticker's steps per interval

// Every interval/kPhases, sends the next header byte of the open connections of that phase
// (slot index modulo kPhases). A write that fails closes its socket, which ends its slot's wait.
asio::awaitable<void> ticker(Run* run) {
  asio::steady_timer tick(co_await asio::this_coro::executor);
  auto next = Clock::now();
  for (int phase = 0;; phase = (phase + 1) % kPhases) {
    for (std::size_t i = static_cast<std::size_t>(phase); i < run->sockets.size(); i += kPhases) {
      tcp::socket* socket = run->sockets[i];
      if (socket == nullptr) continue;
      const char byte = header_byte(*run, run->sent[i]++);
      boost::system::error_code ec;
      socket->send(asio::buffer(&byte, 1), 0, ec);  // non-blocking: one byte always fits
      if (ec) socket->close(ec);
    }
    next += run->interval / kPhases;
    tick.expires_at(next);
    auto [ec] = co_await tick.async_wait(use_nothrow);
    if (ec) co_return;
  }
}

// Ends when the server closes the connection (or answers it, which also means a refusal: the
// header never completes), or the ticker closed it. One wait per connection, not one per byte.
asio::awaitable<void> until_closed(tcp::socket* socket) {
  co_await socket->async_wait(tcp::socket::wait_read, use_nothrow);
}

// One slot: connect, send a byte per interval until the server closes, then start again.
asio::awaitable<void> slot(Run* run, std::size_t index) {
  auto executor = co_await asio::this_coro::executor;
  for (;;) {
    while (run->connecting >= run->max_connecting) {
      co_await run->connect_slot.async_wait(use_nothrow);
    }
    ++run->connecting;
    tcp::socket socket(executor);
    auto [ec] = co_await socket.async_connect(run->endpoint, use_nothrow);
    --run->connecting;
    run->connect_slot.cancel_one();
    if (ec) {
      ++run->refused;
      asio::steady_timer pause(executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(use_nothrow);
      continue;
    }
    ++run->open;
    if (!run->ready_reported && run->open == run->target) {
      run->ready_reported = true;
      std::printf("ready %d\n", run->open);
      std::fflush(stdout);
    }
    const auto opened = Clock::now();
    boost::system::error_code nec;
    socket.non_blocking(true, nec);
    run->sockets[index] = &socket;
    run->sent[index] = 0;
    // The run ends by stopping the io_context, so this returns only when the server cut it.
    co_await until_closed(&socket);
    run->sockets[index] = nullptr;
    --run->open;
    run->lived_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - opened).count());
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  int connections = 10000;
  int interval_ms = 1000;
  int max_connecting = 256;
  po::options_description options("slow_headers");
  options.add_options()("host", po::value(&host))("port", po::value(&port)->required())(
      "connections", po::value(&connections))("interval-ms", po::value(&interval_ms))(
      "max-connecting", po::value(&max_connecting));
  if (!idemgate::bench::parse_options(argc, argv, options)) return 2;

  asio::io_context io(1);
  Run run(io);
  run.endpoint = tcp::endpoint(asio::ip::make_address(host), port);
  run.header = "POST /payments HTTP/1.1\r\nHost: " + host + "\r\nX-Slow: ";
  run.interval = std::chrono::milliseconds(interval_ms);
  run.target = connections;
  run.max_connecting = std::max(1, max_connecting);
  run.sockets.assign(static_cast<std::size_t>(std::max(0, connections)), nullptr);
  run.sent.assign(run.sockets.size(), 0);
  const auto rethrow = [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  };
  for (std::size_t i = 0; i < run.sockets.size(); ++i) asio::co_spawn(io, slot(&run, i), rethrow);
  asio::co_spawn(io, ticker(&run), rethrow);
  // EOF on stdin ends the run: the figures, then every socket closes with the io_context.
  const idemgate::bench::StdinWatch watch(io, [&] {
    auto& v = run.lived_ms;
    std::printf(
        "cut=%zu lived_ms_min=%.0f lived_ms_p50=%.0f lived_ms_p99=%.0f lived_ms_max=%.0f "
        "open=%d refused=%d\n",
        v.size(), v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()),
        idemgate::bench::percentile(v, 0.5), idemgate::bench::percentile(v, 0.99),
        idemgate::bench::percentile(v, 1.0), run.open, run.refused);
    std::fflush(stdout);
    io.stop();
  });
  io.run();
  return 0;
}
