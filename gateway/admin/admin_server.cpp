#include "gateway/admin/admin_server.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <exception>
#include <future>
#include <list>
#include <memory>
#include <tuple>

#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "gateway/http/body_reader.hpp"
#include "gateway/http/connection_gate.hpp"
#include "storage/pg/pg_pool.hpp"
#include "storage/redis/redis_client.hpp"

namespace idemgate::admin {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;
using common::log_json;
using common::use_nothrow;

namespace {

/// A scraper or probe that stalls is dropped after this long per request.
constexpr auto kRequestTimeout = std::chrono::seconds(10);
/// Admin connections open at once; more wait in the backlog (conf/REFERENCE.md, "Limits and
/// queue bounds"). Scrapers and probes need a few.
constexpr std::size_t kMaxConnections = 16;
/// How often a full admin listener looks for a free slot again.
constexpr auto kFullWait = std::chrono::milliseconds(100);
/// Backoff after an accept error (EMFILE), doubling up to kMaxBackoff.
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
constexpr std::uint64_t kMaxRequestBody = 64 * 1024;

/// Admin connections waiting for their next request (nothing of it read yet), oldest first.
/// When the listener is full and a connection waits in its backlog, the oldest is closed to
/// make room: a scraper's pool of kept-alive connections must not shut probes out (C30).
class IdleConnections {
 public:
  struct Entry {
    beast::tcp_stream* stream;
    bool* listed;  ///< cleared when the entry is taken out by close_oldest
  };
  std::list<Entry>::iterator add(beast::tcp_stream& stream, bool& listed) {
    listed = true;
    return entries_.insert(entries_.end(), Entry{&stream, &listed});
  }
  void remove(std::list<Entry>::iterator entry) { entries_.erase(entry); }
  /// Closes the connection idle longest (its pending read ends), if one is idle.
  void close_oldest() {
    if (entries_.empty()) return;
    Entry oldest = entries_.front();
    entries_.pop_front();
    *oldest.listed = false;
    oldest.stream->close();
  }

 private:
  std::list<Entry> entries_;
};

struct Stores {
  StoreChecker* checker;
  const std::atomic<bool>* draining;  ///< set when a drain began (C45)
  const AdminServer::ReadyObserver* on_ready;
  const AdminServer::DegradedSource* degraded;
};

bhttp::response<bhttp::string_body> json_response(bhttp::status status, const json::object& body,
                                                  unsigned version) {
  bhttp::response<bhttp::string_body> res{status, version};
  res.set(bhttp::field::content_type, "application/json");
  res.set(bhttp::field::cache_control, "no-store");
  res.body() = json::serialize(body) + "\n";
  return res;
}

// The /readyz rule (C30, C45, C58), told to the observer (idemgate_ready) whoever asked.
asio::awaitable<ReadinessReport> check_readiness(Stores stores, bool with_checks) {
  ReadinessReport report;
  if (stores.draining->load(std::memory_order_relaxed)) {
    report.draining = true;
  } else {
    report = co_await stores.checker->run(with_checks);
    report.degraded = *stores.degraded && (*stores.degraded)();
  }
  if (*stores.on_ready)
    (*stores.on_ready)(report.status() == "ready" || report.status() == "degraded");
  co_return report;
}

asio::awaitable<void> serve(tcp::socket socket, Stores stores,
                            AdminServer::MetricsText* metrics_text,
                            std::shared_ptr<IdleConnections> idle) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.body_limit(kMaxRequestBody);
    http::check_chunk_extensions(parser);
    stream.expires_after(kRequestTimeout);
    if (buffer.size() == 0) {
      // Idle until the request's first bytes: the listener may close it to make room.
      bool listed = false;
      const auto entry = idle->add(stream, listed);
      auto [rec, got] = co_await stream.async_read_some(buffer.prepare(4096), use_nothrow);
      if (listed) idle->remove(entry);
      if (rec) break;
      buffer.commit(got);
    }
    auto [ec, n] = co_await bhttp::async_read_header(stream, buffer, parser, use_nothrow);
    if (ec) break;
    // The same body reader as the proxy's sessions: Beast 1.81's chunk-parser assertion is
    // reachable from any client otherwise.
    if (!parser.is_done() && co_await http::async_read_body(stream, buffer, parser)) break;
    const auto& req = parser.get();
    const unsigned version = req.version();
    const std::string_view target = req.target();
    const std::string_view path = target.substr(0, target.find('?'));

    bhttp::response<bhttp::string_body> res;
    if (req.method() != bhttp::verb::get && req.method() != bhttp::verb::head) {
      res = json_response(bhttp::status::method_not_allowed,
                          {{"status", "error"}, {"detail", "use GET"}}, version);
      res.set(bhttp::field::allow, "GET, HEAD");
    } else if (path == "/healthz") {
      res = json_response(bhttp::status::ok, {{"status", "ok"}}, version);
    } else if (path == "/readyz") {
      const auto report = co_await check_readiness(stores, true);
      const bool ok = report.status() == "ready" || report.status() == "degraded";
      res = json_response(ok ? bhttp::status::ok : bhttp::status::service_unavailable,
                          report.to_json(), version);
    } else if (path == "/metrics") {
      co_await check_readiness(stores, false);  // idemgate_ready as of this scrape
      res = bhttp::response<bhttp::string_body>{bhttp::status::ok, version};
      res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = (*metrics_text)();
    } else {
      res = json_response(bhttp::status::not_found,
                          {{"status", "error"}, {"detail", "try /healthz, /readyz or /metrics"}},
                          version);
    }
    // The parser's verdict reads every Connection field line; the message's only the first.
    const bool keep_alive = parser.keep_alive();
    res.keep_alive(keep_alive);
    res.prepare_payload();
    if (req.method() == bhttp::verb::head) {
      const auto length = res.body().size();
      res.body().clear();
      res.content_length(length);
    }
    stream.expires_after(kRequestTimeout);
    auto [wec, wn] = co_await bhttp::async_write(stream, res, use_nothrow);
    if (wec || !keep_alive) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream.close();
}

asio::awaitable<void> accept_loop(tcp::acceptor* acceptor, Stores stores,
                                  AdminServer::MetricsText* metrics_text) {
  // Bounded like the client listener (C52), so that a flood of the admin port cannot take the
  // descriptors kept for it; shared with the connections, which may outlive this loop.
  auto slots = std::make_shared<http::ConnectionGate>(kMaxConnections, "admin");
  auto idle = std::make_shared<IdleConnections>();
  auto backoff = kFirstBackoff;
  for (;;) {
    if (!slots->try_take()) {
      slots->note_pause("max_connections");
      // Full: once a connection waits in the backlog, an idle one makes room for it.
      auto [wec] = co_await acceptor->async_wait(tcp::acceptor::wait_read, use_nothrow);
      if (!acceptor->is_open()) co_return;
      if (!wec) idle->close_oldest();
      asio::steady_timer pause(acceptor->get_executor(), kFullWait);
      co_await pause.async_wait(use_nothrow);
      if (!acceptor->is_open()) co_return;
      continue;
    }
    auto [ec, socket] = co_await acceptor->async_accept(use_nothrow);
    if (ec) {
      slots->give_back();
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      if (ec == asio::error::connection_aborted) continue;  // that connection only
      // Out of descriptors (EMFILE) fails again at once: back off instead of spinning.
      slots->note_pause(ec.message());
      asio::steady_timer pause(acceptor->get_executor(), backoff);
      co_await pause.async_wait(use_nothrow);
      backoff = std::min(backoff * 2, kMaxBackoff);
      continue;
    }
    backoff = kFirstBackoff;
    asio::co_spawn(
        acceptor->get_executor(), serve(std::move(socket), stores, metrics_text, idle),
        [slots, log = common::log_on_exception("admin session failed")](std::exception_ptr e) {
          slots->give_back();
          log(e);
        });
  }
}

}  // namespace

AdminServer::AdminServer(const config::Config& config, MetricsText metrics_text,
                         std::shared_ptr<core::PrimaryTracker> pg_primary,
                         std::shared_ptr<core::PrimaryTracker> redis_primary,
                         ReadyObserver on_ready, DegradedSource degraded)
    : acceptor_(io_),
      metrics_text_(std::move(metrics_text)),
      on_ready_(std::move(on_ready)),
      degraded_(std::move(degraded)),
      address_(config.admin.address) {
  checker_ = std::make_unique<StoreChecker>(io_.get_executor(), config.storage,
                                            std::move(pg_primary), std::move(redis_primary));

  const tcp::endpoint endpoint(asio::ip::make_address(config.admin.address), config.admin.port);
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.bind(endpoint);
  acceptor_.listen(asio::socket_base::max_listen_connections);
  port_ = acceptor_.local_endpoint().port();
}

AdminServer::~AdminServer() {
  stop();
  // The store connections go before the io_context they are registered with (RedisConnection's
  // rule); probe frames still suspended on them are destroyed with the io_context.
  checker_.reset();
}

void AdminServer::start() {
  if (thread_.joinable()) return;
  asio::co_spawn(io_,
                 accept_loop(&acceptor_, Stores{checker_.get(), &draining_, &on_ready_, &degraded_},
                             &metrics_text_),
                 common::log_on_exception("admin accept loop failed"));
  log_json(spdlog::level::info, "admin listening", {{"address", address_}, {"port", port_}});
  thread_ = std::thread([this] { io_.run(); });
}

ReadinessReport AdminServer::check_stores_now() {
  auto done = asio::co_spawn(io_, checker_->run(true), asio::use_future);
  // Not io_.run(): the store connections keep a read armed, so it would never run out of work.
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) io_.run_one();
  return done.get();
}

void AdminServer::check_stores(std::function<void(ReadinessReport)> done) {
  asio::co_spawn(io_, checker_->run(true),
                 [done = std::move(done)](std::exception_ptr e, ReadinessReport report) {
                   if (e) {
                     common::log_on_exception("store checks failed")(e);
                     return;
                   }
                   done(std::move(report));
                 });
}

void AdminServer::stop() {
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  });
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace idemgate::admin
