// Routing to the primary that Redis Sentinel names (SPEC C41).

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <chrono>

#include "gateway/common/use_nothrow.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_routing.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using boost::system::result;
using core::store_errc;

using common::use_nothrow;

std::string describe_failure(const result<Reply>& reply) {
  if (!reply) return reply.error().message();
  if (reply->is_error()) return reply->str;
  return "unexpected reply";
}

/// Undos a former primary refused (it is a replica now), waiting for the primary in use. Shared
/// with the connections' refusal handlers, which may outlive the routing.
struct UndoInbox {
  std::vector<Undo> undos;
  std::weak_ptr<RedisConnection> primary;
  bool primary_refused = false;  ///< the primary in use refused one: it is not one any more

  void deliver() {
    auto to = primary.lock();
    if (!to || undos.empty()) return;
    to->adopt_undos(std::exchange(undos, {}));
  }
};

/// The primary named by Redis Sentinel (SPEC C41). The sentinels are asked in turn
/// (`SENTINEL get-master-addr-by-name`), starting with the one that answered last; the node they
/// name is used only after it answers `ROLE` with `master`. The primary is looked up again after
/// a connection error, a timeout or a not-primary error (`READONLY`, `MASTERDOWN`). One lookup
/// runs at a time; commands issued meanwhile wait for it. The undos of a former primary's
/// connection (RedisConnection) go to the new primary's: a lock written there just before the
/// failover may have reached the replica that is the primary now.
class SentinelRouting final : public Routing {
 public:
  SentinelRouting(asio::any_io_executor executor, const config::Redis& options,
                  std::shared_ptr<core::PrimaryTracker> tracker)
      : executor_(std::move(executor)), options_(options), tracker_(std::move(tracker)) {
    sentinels_.resize(options_.sentinels.size());
  }

  asio::awaitable<result<std::shared_ptr<RedisConnection>>> route(std::string_view key) override {
    (void)key;  // one primary holds every key
    if (std::exchange(inbox_->primary_refused, false)) stale_ = true;
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
      SentinelRouting* self;
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

  void failed(const RedisConnection& connection) override {
    if (&connection == primary_.get()) stale_ = true;
  }

  bool follows_failover() const override { return true; }

  asio::awaitable<std::string> probe(RedisClient& client) override {
    Command ping{"PING"};  // not a temporary inside the co_await: GCC 12 rejects that
    auto reply = co_await client.execute(std::string{}, std::move(ping));
    if (reply && reply->is_status("PONG")) co_return std::string{};
    if (!reply) co_return last_failure_.empty() ? reply.error().message() : last_failure_;
    co_return describe_failure(reply);
  }

  std::uint64_t connect_count() const override {
    return retired_connects_ + (primary_ ? primary_->connect_count() : 0);
  }

  asio::awaitable<std::vector<RedisClient::NodeReply>> on_each_primary(RedisClient& client,
                                                                       Command command) override {
    auto reply = co_await client.execute(std::string{}, std::move(command));
    std::vector<RedisClient::NodeReply> out;
    out.push_back(
        {primary_ ? endpoint_text(primary_->address(), primary_->port()) : std::string("redis"),
         std::move(reply)});
    co_return out;
  }

 private:
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

  std::shared_ptr<RedisConnection> data_connection(const std::string& host, std::uint16_t port) {
    config::Redis o = options_;
    o.address = host;
    o.port = port;
    auto connection = std::make_shared<RedisConnection>(executor_, std::move(o));
    connection->on_refused_undo([inbox = std::weak_ptr<UndoInbox>(inbox_), from = connection.get()](
                                    Undo undo, const Reply&) {
      auto box = inbox.lock();
      if (!box) return;
      box->undos.push_back(std::move(undo));
      if (box->primary.lock().get() == from) {
        box->primary_refused = true;  // kept for the primary the next lookup finds
        return;
      }
      box->deliver();
    });
    return connection;
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
      if (!candidate || endpoint != primary_endpoint_)
        candidate = data_connection(host, static_cast<std::uint16_t>(port));
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
        if (primary_) {
          retired_connects_ += primary_->connect_count();
          candidate->adopt_undos(primary_->take_undos());
        }
        primary_ = std::move(candidate);
        primary_endpoint_ = endpoint;
        inbox_->primary = primary_;
      }
      stale_ = false;
      last_failure_.clear();
      inbox_->deliver();
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
  std::shared_ptr<UndoInbox> inbox_ = std::make_shared<UndoInbox>();
};

}  // namespace

std::unique_ptr<Routing> sentinel_routing(asio::any_io_executor executor,
                                          const config::Redis& options,
                                          std::shared_ptr<core::PrimaryTracker> tracker) {
  return std::make_unique<SentinelRouting>(std::move(executor), options, std::move(tracker));
}

}  // namespace idemgate::storage::redis
