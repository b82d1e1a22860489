#include "storage/redis/redis_client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>

#include "storage/redis/redis_cluster.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using core::store_errc;
using ReplyResult = boost::system::result<Reply>;

inline constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

std::string describe_failure(const ReplyResult& reply) {
  if (!reply) return reply.error().message();
  if (reply->is_error()) return reply->str;
  return "unexpected reply";
}

/// The primary named by Redis Sentinel (SPEC C41). The sentinels are asked in turn
/// (`SENTINEL get-master-addr-by-name`), starting with the one that answered last; the node they
/// name is used only after it answers `ROLE` with `master`. The primary is looked up again after
/// a connection error, a timeout or a not-primary error (`READONLY`, `MASTERDOWN`): a command
/// refused as not-primary did not run and is retried once on the new primary; any other failure
/// is returned (the command may have run) and only the next command looks up the new primary.
/// One lookup runs at a time; commands issued meanwhile wait for it.
class SentinelClient final : public RedisClient {
 public:
  SentinelClient(asio::any_io_executor executor, const config::Redis& options,
                 std::shared_ptr<core::PrimaryTracker> tracker)
      : executor_(std::move(executor)), options_(options), tracker_(std::move(tracker)) {
    sentinels_.resize(options_.sentinels.size());
  }

  asio::awaitable<ReplyResult> execute(std::string key, std::vector<std::string> argv,
                                       Undo undo) override {
    (void)key;  // one primary holds every key
    for (int attempt = 0;; ++attempt) {
      auto primary = co_await current();
      if (!primary) co_return primary.error();
      std::shared_ptr<RedisConnection> connection = *primary;
      auto reply = co_await execute_one(*connection, argv, undo);
      if (!reply) {
        if (reply.error() != asio::error::operation_aborted) forget(connection);
        co_return reply;
      }
      if (is_not_primary_error(*reply)) {
        forget(connection);
        if (attempt == 0) continue;
        co_return make_error_code(store_errc::unavailable);
      }
      co_return reply;
    }
  }

  asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_then(
      std::string key, std::vector<std::string> argv, std::vector<std::string> then,
      Undo undo) override {
    (void)key;
    for (int attempt = 0;; ++attempt) {
      auto primary = co_await current();
      if (!primary) co_return primary.error();
      std::shared_ptr<RedisConnection> connection = *primary;
      auto replies = co_await execute_pair(*connection, argv, then, undo);
      if (!replies) {
        if (replies.error() != asio::error::operation_aborted) forget(connection);
        co_return replies;
      }
      if (is_not_primary_error(replies->first)) {
        forget(connection);
        if (attempt == 0) continue;
        co_return make_error_code(store_errc::unavailable);
      }
      co_return replies;
    }
  }

  asio::awaitable<std::string> probe() override {
    std::vector<std::string> ping{"PING"};
    auto reply = co_await execute(std::string{}, std::move(ping), Undo{});
    if (reply && reply->is_status("PONG")) co_return std::string{};
    if (!reply) co_return last_failure_.empty() ? reply.error().message() : last_failure_;
    co_return describe_failure(reply);
  }

  std::uint64_t connect_count() const override {
    return retired_connects_ + (primary_ ? primary_->connect_count() : 0);
  }

 private:
  using PrimaryResult = boost::system::result<std::shared_ptr<RedisConnection>>;

  /// The primary's connection, looked up first when there is none or it was given up.
  asio::awaitable<PrimaryResult> current() {
    if (primary_ && !stale_) co_return primary_;
    if (lookup_gate_) {
      // Another command is asking the sentinels: wait for its answer instead of asking again.
      auto gate = lookup_gate_;
      co_await gate->async_wait(use_nothrow);
      if (primary_ && !stale_) co_return primary_;
      co_return make_error_code(store_errc::unavailable);
    }
    lookup_gate_ =
        std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    // However the lookup ends (a cancelled caller throws at its next co_await), the gate opens
    // and the next command may look up again: no command waits on a lookup nobody runs.
    struct OpenGate {
      SentinelClient* self;
      std::shared_ptr<asio::steady_timer> gate;
      ~OpenGate() {
        if (self->lookup_gate_ == gate) self->lookup_gate_.reset();
        gate->cancel();
      }
    } open_gate{this, lookup_gate_};
    const bool found = co_await look_up();
    if (found) co_return primary_;
    co_return make_error_code(store_errc::unavailable);
  }

  /// Marks `connection` as no longer trusted to be the primary (when it still is the current one).
  void forget(const std::shared_ptr<RedisConnection>& connection) {
    if (connection == primary_) stale_ = true;
  }

  RedisConnection& sentinel(std::size_t i) {
    if (!sentinels_[i]) {
      config::Redis o;
      o.address = options_.sentinels[i].host;
      o.port = options_.sentinels[i].port;
      o.password = options_.sentinel_password;
      o.username = options_.sentinel_username;
      o.db = 0;
      o.operation_timeout = options_.operation_timeout;
      sentinels_[i] = std::make_unique<RedisConnection>(executor_, std::move(o),
                                                        RedisConnection::Kind::control);
    }
    return *sentinels_[i];
  }

  /// Asks the sentinels in turn; true once one named a node that answers ROLE as a primary.
  asio::awaitable<bool> look_up() {
    const std::size_t n = sentinels_.size();
    // One lookup stays within about one operation_timeout beyond the sentinel it is asking:
    // after that the command fails (C25) rather than trying sentinel after sentinel.
    const auto give_up = std::chrono::steady_clock::now() + options_.operation_timeout;
    bool named = false;  // some sentinel answered with an address
    for (std::size_t k = 0; k < n; ++k) {
      if (k > 0 && std::chrono::steady_clock::now() >= give_up) {
        last_failure_ += " (gave up after operation_timeout)";
        break;
      }
      const std::size_t i = (next_sentinel_ + k) % n;
      const std::string who = endpoint_text(options_.sentinels[i].host, options_.sentinels[i].port);
      auto answer =
          co_await sentinel(i).command("SENTINEL", "get-master-addr-by-name", options_.master_name);
      if (!answer || answer->kind != Reply::Kind::array || answer->elements.size() != 2 ||
          answer->elements[0].kind != Reply::Kind::string ||
          answer->elements[1].kind != Reply::Kind::string) {
        last_failure_ = "sentinel " + who + ": " +
                        (answer && answer->is_nil() ? "does not know master " + options_.master_name
                                                    : describe_failure(answer));
        continue;
      }
      const std::string& host = answer->elements[0].str;
      const std::string& port_text = answer->elements[1].str;
      unsigned port = 0;
      const auto [end, ec] =
          std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
      if (ec != std::errc{} || end != port_text.data() + port_text.size() || port == 0 ||
          port > 65535) {
        last_failure_ = "sentinel " + who + ": bad port " + port_text;
        continue;
      }
      named = true;
      const std::string endpoint = endpoint_text(host, static_cast<std::uint16_t>(port));
      std::shared_ptr<RedisConnection> candidate = primary_;
      if (!candidate || endpoint != primary_endpoint_) {
        config::Redis o = options_;
        o.address = host;
        o.port = static_cast<std::uint16_t>(port);
        candidate = std::make_shared<RedisConnection>(executor_, std::move(o));
        if (primary_) candidate->adopt_undos(primary_->take_undos());
      }
      // Never a lock command to a replica: the named node must say it is the primary.
      auto role = co_await candidate->command("ROLE");
      if (!role || role->kind != Reply::Kind::array || role->elements.empty() ||
          role->elements[0].str != "master") {
        last_failure_ = "sentinel " + who + " names " + endpoint + ", which " +
                        (role && !role->is_error() && role->kind == Reply::Kind::array &&
                                 !role->elements.empty()
                             ? "is a " + role->elements[0].str + ", not the primary"
                             : "does not answer: " + describe_failure(role));
        continue;
      }
      next_sentinel_ = i;
      if (candidate != primary_) {
        if (primary_) retired_connects_ += primary_->connect_count();
        primary_ = std::move(candidate);
        primary_endpoint_ = endpoint;
      }
      stale_ = false;
      last_failure_.clear();
      if (tracker_) tracker_->use({}, endpoint);
      co_return true;
    }
    // No sentinel answered at all (all down or unreachable) while the primary in use may be
    // fine: keep it if it still says it is the primary. Not when a sentinel named another node:
    // then a failover is under way and the old primary must not be written to.
    if (!named && primary_) {
      auto role = co_await primary_->command("ROLE");
      if (role && role->kind == Reply::Kind::array && !role->elements.empty() &&
          role->elements[0].str == "master") {
        stale_ = false;
        co_return true;
      }
    }
    co_return false;
  }

  asio::any_io_executor executor_;
  config::Redis options_;
  std::shared_ptr<core::PrimaryTracker> tracker_;
  std::vector<std::unique_ptr<RedisConnection>> sentinels_;  ///< opened on first use
  std::size_t next_sentinel_ = 0;
  std::shared_ptr<RedisConnection> primary_;
  std::string primary_endpoint_;
  bool stale_ = false;
  std::shared_ptr<asio::steady_timer> lookup_gate_;  ///< set while a lookup runs
  std::string last_failure_;
  std::uint64_t retired_connects_ = 0;
};

}  // namespace

asio::awaitable<ReplyResult> SingleServerClient::execute(std::string key,
                                                         std::vector<std::string> argv, Undo undo) {
  (void)key;
  co_return co_await execute_one(*connection_, std::move(argv), std::move(undo));
}

asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> SingleServerClient::execute_then(
    std::string key, std::vector<std::string> argv, std::vector<std::string> then, Undo undo) {
  (void)key;
  co_return co_await execute_pair(*connection_, std::move(argv), std::move(then), std::move(undo));
}

asio::awaitable<boost::system::result<std::pair<Reply, Reply>>> execute_pair(
    RedisConnection& connection, std::vector<std::string> first, std::vector<std::string> second,
    Undo undo, bool asking) {
  std::vector<Command> commands;
  if (asking) commands.push_back({"ASKING"});
  commands.push_back(std::move(first));
  commands.push_back(std::move(second));
  auto replies = co_await connection.execute(std::move(commands), std::move(undo));
  if (!replies) co_return replies.error();
  const std::size_t at = asking ? 1 : 0;
  co_return std::pair<Reply, Reply>{std::move((*replies)[at]), std::move((*replies)[at + 1])};
}

asio::awaitable<ReplyResult> execute_one(RedisConnection& connection, std::vector<std::string> argv,
                                         Undo undo, bool asking) {
  std::vector<Command> commands;
  if (asking) commands.push_back({"ASKING"});
  commands.push_back(std::move(argv));
  auto replies = co_await connection.execute(std::move(commands), std::move(undo));
  if (!replies) co_return replies.error();
  co_return std::move(replies->back());
}

asio::awaitable<std::string> SingleServerClient::probe() {
  auto reply = co_await connection_->command("PING");
  if (!reply) co_return reply.error().message();
  if (!reply->is_status("PONG")) co_return "unexpected answer to PING: " + reply->str;
  co_return std::string{};
}

std::unique_ptr<RedisClient> make_redis_client(asio::any_io_executor executor,
                                               const config::Redis& options,
                                               std::shared_ptr<core::PrimaryTracker> tracker) {
  switch (options.mode) {
    case config::Redis::Mode::standalone:
      return std::make_unique<SingleServerClient>(
          std::make_unique<RedisConnection>(std::move(executor), options));
    case config::Redis::Mode::sentinel:
      return std::make_unique<SentinelClient>(std::move(executor), options, std::move(tracker));
    case config::Redis::Mode::cluster:
      break;
  }
  return make_cluster_client(std::move(executor), options, std::move(tracker));
}

std::string endpoint_text(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool is_not_primary_error(const Reply& reply) {
  if (!reply.is_error()) return false;
  // A script's write on a replica fails inside the script: Redis puts READONLY in its message.
  return reply.str.starts_with("READONLY") || reply.str.starts_with("MASTERDOWN") ||
         reply.str.find("-READONLY") != std::string::npos ||
         reply.str.find("READONLY You can't write") != std::string::npos;
}

}  // namespace idemgate::storage::redis
