// payment-service: the example "legacy API" behind idemgate. It keeps its own second layer of
// protection (seed R-DIST-IDEM-4): UNIQUE (provider, external_payment_id) in Postgres.
//
//   payment-service --listen 127.0.0.1:9001 --dsn postgresql://idem@127.0.0.1/payments
//                   [--delay-ms N] [--keep-alive-timeout S]
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 runtime failure, 2 bad arguments.

#include <signal.h>

#include <boost/asio/ip/address.hpp>
#include <boost/program_options.hpp>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <thread>

#include "examples/payment-service/http_server.hpp"
#include "examples/payment-service/json_log.hpp"
#include "examples/payment-service/payment_api.hpp"
#include "examples/payment-service/payment_store.hpp"

namespace {

namespace po = boost::program_options;
namespace payment = idemgate::examples::payment;
using boost::asio::ip::tcp;

struct Options {
  tcp::endpoint listen;
  std::string dsn;
  std::chrono::milliseconds delay{0};
  std::chrono::seconds keep_alive{5};
};

tcp::endpoint parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) throw po::error("--listen must be HOST:PORT");
  std::string host = text.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const unsigned long port = std::stoul(text.substr(colon + 1));
  if (port > 65535) throw po::error("--listen port must be at most 65535");
  return {boost::asio::ip::make_address(host), static_cast<unsigned short>(port)};
}

// Returns nullopt after printing help.
std::optional<Options> parse_options(int argc, char** argv) {
  std::string listen;
  long long delay_ms = 0;
  long long keep_alive_s = 5;
  Options options;
  po::options_description desc("payment-service options");
  desc.add_options()("help,h", "show this help")("listen", po::value(&listen)->required(),
                                                 "HOST:PORT to listen on (port 0: any free one)")(
      "dsn", po::value(&options.dsn)->required(), "Postgres connection string or URI")(
      "delay-ms", po::value(&delay_ms)->default_value(0),
      "artificial latency added to every POST, in milliseconds")(
      "keep-alive-timeout", po::value(&keep_alive_s)->default_value(5),
      "seconds an idle keep-alive connection stays open (advertised as Keep-Alive: timeout=N)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << '\n';
    return std::nullopt;
  }
  po::notify(vm);
  if (delay_ms < 0) throw po::error("--delay-ms must not be negative");
  if (keep_alive_s < 1) throw po::error("--keep-alive-timeout must be at least 1");
  options.listen = parse_endpoint(listen);
  options.delay = std::chrono::milliseconds(delay_ms);
  options.keep_alive = std::chrono::seconds(keep_alive_s);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  payment::init_json_log();
  std::optional<Options> options;
  try {
    options = parse_options(argc, argv);
    if (!options) return 0;
  } catch (const std::exception& e) {
    payment::log_json(spdlog::level::err, "bad arguments", {{"error", e.what()}});
    return 2;
  }

  // Block the stop signals in every thread; one thread takes them with sigwait().
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<payment::HttpServer> server;
  payment::Stats stats;
  try {
    payment::ensure_schema(options->dsn);
    const std::string dsn = options->dsn;
    const auto delay = options->delay;
    server = std::make_unique<payment::HttpServer>(
        options->listen, options->keep_alive,
        [dsn, delay, &stats]() -> payment::HttpServer::Handler {
          auto store = std::make_shared<payment::PaymentStore>(dsn);
          auto api = std::make_shared<payment::PaymentApi>(*store, stats, delay);
          return [store, api](const payment::Request& req) { return api->handle(req); };
        });
  } catch (const std::exception& e) {
    payment::log_json(spdlog::level::err, "cannot start", {{"error", e.what()}});
    return 1;
  }

  const tcp::endpoint bound = server->local_endpoint();
  payment::log_json(spdlog::level::info, "listening",
                    {{"address", bound.address().to_string()},
                     {"port", bound.port()},
                     {"delay_ms", options->delay.count()},
                     {"keep_alive_timeout_s", options->keep_alive.count()}});

  std::thread([&server, stop_signals] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    payment::log_json(spdlog::level::info, "stopping", {{"signal", signal_number}});
    server->stop();
  }).detach();

  const bool drained = server->run(std::chrono::seconds(10));
  payment::log_json(spdlog::level::info, "stopped", {{"drained", drained}});
  // Connection threads still busy after the drain hold references into `server`: leave without
  // running destructors.
  if (!drained) std::_Exit(0);
  return 0;
}
