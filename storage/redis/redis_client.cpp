#include "storage/redis/redis_client.hpp"

#include <boost/asio/error.hpp>

#include "gateway/common/host_port.hpp"
#include "storage/redis/redis_routing.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using boost::system::result;
using core::store_errc;

/// Redirects followed for one command before it fails with `unavailable`.
inline constexpr int kMaxRedirects = 5;

bool is_cluster_unavailable(const Reply& reply) {
  return reply.is_error() &&
         (reply.str.starts_with("TRYAGAIN") || reply.str.starts_with("CLUSTERDOWN"));
}

/// One server: every command on one connection, owned or borrowed.
class SingleServerRouting final : public Routing {
 public:
  explicit SingleServerRouting(std::shared_ptr<RedisConnection> connection)
      : connection_(std::move(connection)) {}

  asio::awaitable<result<std::shared_ptr<RedisConnection>>> route(std::string_view key) override {
    (void)key;
    co_return connection_;
  }
  void failed(const RedisConnection& connection) override { (void)connection; }
  bool follows_failover() const override { return false; }

  asio::awaitable<std::string> probe(RedisClient& client) override {
    Command ping{"PING"};  // not a temporary inside the co_await: GCC 12 rejects that
    auto reply = co_await client.execute(std::string{}, std::move(ping));
    if (!reply) co_return reply.error().message();
    if (!reply->is_status("PONG")) co_return "unexpected answer to PING: " + reply->str;
    co_return std::string{};
  }

  std::uint64_t connect_count() const override { return connection_->connect_count(); }

  asio::awaitable<std::vector<RedisClient::NodeReply>> on_each_primary(RedisClient& client,
                                                                       Command command) override {
    // Awaited into a local first: GCC 12 destroys a co_await result inside a braced initializer
    // too early.
    auto reply = co_await client.execute(std::string{}, std::move(command));
    std::vector<RedisClient::NodeReply> out;
    out.push_back({endpoint_text(connection_->address(), connection_->port()), std::move(reply)});
    co_return out;
  }

 private:
  std::shared_ptr<RedisConnection> connection_;
};

}  // namespace

asio::awaitable<void> Routing::moved(std::uint64_t seen) {
  (void)seen;
  co_return;
}

RedisClient::RedisClient(std::unique_ptr<Routing> routing) : routing_(std::move(routing)) {}

RedisClient::RedisClient(RedisConnection& connection)
    // Borrowed: the aliasing shared_ptr owns nothing.
    : routing_(single_server_routing(
          std::shared_ptr<RedisConnection>(std::shared_ptr<RedisConnection>{}, &connection))) {}

RedisClient::~RedisClient() = default;

asio::awaitable<result<std::vector<Reply>>> RedisClient::execute(std::string key,
                                                                 std::vector<Command> commands,
                                                                 Undo undo) {
  if (commands.empty()) co_return std::vector<Reply>{};
  std::shared_ptr<RedisConnection> target;
  bool asking = false;
  bool rerouted = false;
  // Where neither a failover nor a redirect sends the batch again (one server), the batch and
  // its undo go out as they are; elsewhere each attempt sends a copy.
  const bool sent_once = !routing_->follows_failover() && !routing_->redirects();
  for (int redirects = 0;;) {
    if (!target) {
      auto routed = co_await routing_->route(key);
      if (!routed) co_return routed.error();
      target = std::move(*routed);
    }
    const auto seen = routing_->generation();  // the map this attempt was routed by
    result<std::vector<Reply>> replies;
    if (sent_once) {
      // The only attempt: every exit below returns unless the routing follows a failover or a
      // redirect.
      replies = co_await target->execute(std::move(commands), std::move(undo));
    } else {
      std::vector<Command> batch;
      batch.reserve(commands.size() + (asking ? 1 : 0));
      if (asking) batch.push_back({"ASKING"});  // a node importing the slot serves it only then
      batch.insert(batch.end(), commands.begin(), commands.end());
      replies = co_await target->execute(std::move(batch), undo);
    }
    if (!replies) {
      // The command may have run; the server may have failed over: look up before the next.
      if (replies.error() != asio::error::operation_aborted) routing_->failed(*target);
      co_return replies.error();
    }
    if (asking) replies->erase(replies->begin());
    const Reply& first = replies->front();
    if (is_not_primary_error(first)) {
      routing_->failed(*target);
      if (rerouted || !routing_->follows_failover())
        co_return make_error_code(store_errc::unavailable);
      rerouted = true;
      target.reset();
      asking = false;
      continue;
    }
    if (is_cluster_unavailable(first)) {
      routing_->failed(*target);
      co_return make_error_code(store_errc::unavailable);
    }
    auto redirect = parse_redirect(first, target->address());
    if (!redirect) co_return replies;
    if (++redirects > kMaxRedirects) co_return make_error_code(store_errc::unavailable);
    // MOVED: the slot has a new owner for good; ASK: only this command goes there.
    if (!redirect->ask) co_await routing_->moved(seen);
    target = routing_->redirected(redirect->to);
    if (!target) co_return make_error_code(store_errc::unavailable);
    asking = redirect->ask;
  }
}

asio::awaitable<result<Reply>> RedisClient::execute(std::string key, Command command, Undo undo) {
  std::vector<Command> one;
  one.push_back(std::move(command));
  auto replies = co_await execute(std::move(key), std::move(one), std::move(undo));
  if (!replies) co_return replies.error();
  co_return std::move(replies->front());
}

asio::awaitable<std::string> RedisClient::probe() {
  return routing_->probe(*this);
}

asio::awaitable<std::vector<RedisClient::NodeReply>> RedisClient::on_each_primary(Command command) {
  return routing_->on_each_primary(*this, std::move(command));
}

std::uint64_t RedisClient::connect_count() const {
  return routing_->connect_count();
}

std::unique_ptr<Routing> single_server_routing(std::shared_ptr<RedisConnection> connection) {
  return std::make_unique<SingleServerRouting>(std::move(connection));
}

std::unique_ptr<RedisClient> make_redis_client(asio::any_io_executor executor,
                                               const config::Redis& options,
                                               std::shared_ptr<core::PrimaryTracker> tracker) {
  switch (options.mode) {
    case config::Redis::Mode::standalone:
      return std::make_unique<RedisClient>(
          single_server_routing(std::make_shared<RedisConnection>(std::move(executor), options)));
    case config::Redis::Mode::sentinel:
      return std::make_unique<RedisClient>(
          sentinel_routing(std::move(executor), options, std::move(tracker)));
    case config::Redis::Mode::cluster:
      break;
  }
  return std::make_unique<RedisClient>(
      cluster_routing(std::move(executor), options, std::move(tracker)));
}

std::string endpoint_text(const std::string& host, std::uint16_t port) {
  return common::format_host_port(host, port);
}

bool is_not_primary_error(const Reply& reply) {
  if (!reply.is_error()) return false;
  // A script's write on a replica fails inside the script: Redis puts READONLY in its message.
  return reply.str.starts_with("READONLY") || reply.str.starts_with("MASTERDOWN") ||
         reply.str.find("-READONLY") != std::string::npos ||
         reply.str.find("READONLY You can't write") != std::string::npos;
}

std::optional<Endpoint> parse_endpoint(std::string_view text) {
  auto parsed = common::parse_host_port(text);
  if (!parsed.value) return {};
  return Endpoint{std::move(parsed.value->host), parsed.value->port};
}

std::optional<Redirect> parse_redirect(const Reply& reply, const std::string& from_host) {
  if (!reply.is_error()) return {};
  std::string_view text = reply.str;
  Redirect redirect;
  if (text.starts_with("MOVED ")) {
    text.remove_prefix(6);
  } else if (text.starts_with("ASK ")) {
    redirect.ask = true;
    text.remove_prefix(4);
  } else {
    return {};
  }
  const auto space = text.find(' ');
  if (space == std::string_view::npos) return {};
  auto to = parse_endpoint(text.substr(space + 1));
  if (!to) return {};
  if (to->host.empty()) to->host = from_host;
  redirect.to = std::move(*to);
  return redirect;
}

}  // namespace idemgate::storage::redis
