#include "storage/redis/redis_cluster.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <limits>
#include <map>
#include <set>

#include "gateway/common/host_port.hpp"
#include "gateway/common/use_nothrow.hpp"
#include "storage/redis/redis_client.hpp"
#include "storage/redis/redis_routing.hpp"

namespace idemgate::storage::redis {
namespace {

namespace asio = boost::asio;
using boost::system::result;
using core::store_errc;

using common::use_nothrow;

constexpr std::array<std::uint16_t, 256> make_crc_table() {
  std::array<std::uint16_t, 256> table{};
  for (unsigned i = 0; i < 256; ++i) {
    unsigned crc = i << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000U) ? (crc << 1) ^ 0x1021U : crc << 1;
    table[i] = static_cast<std::uint16_t>(crc & 0xFFFFU);
  }
  return table;
}

// CRC16-CCITT as XMODEM computes it: polynomial 0x1021, initial value 0, no reflection.
constexpr auto kCrcTable = make_crc_table();

std::uint16_t crc16(std::string_view bytes) noexcept {
  unsigned crc = 0;
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    crc = ((crc << 8) ^ kCrcTable[((crc >> 8) ^ byte) & 0xFFU]) & 0xFFFFU;
  }
  return static_cast<std::uint16_t>(crc);
}

std::optional<std::uint16_t> slot_number(const Reply& r) {
  if (r.kind != Reply::Kind::integer || r.integer < 0 || r.integer >= kClusterSlots) return {};
  return static_cast<std::uint16_t>(r.integer);
}

/// The routing table: which primary serves each slot. Pure data, no I/O.
class SlotMap {
 public:
  SlotMap() { owner_.fill(kNone); }

  bool empty() const noexcept { return ranges_.empty(); }
  const std::vector<SlotRange>& ranges() const noexcept { return ranges_; }

  void assign(std::vector<SlotRange> ranges) {
    ranges_ = std::move(ranges);
    owner_.fill(kNone);
    primaries_.clear();
    for (const auto& range : ranges_) {
      auto found = std::find_if(primaries_.begin(), primaries_.end(), [&](const Endpoint& e) {
        return e.host == range.host && e.port == range.port;
      });
      const auto index = static_cast<std::uint16_t>(found - primaries_.begin());
      if (found == primaries_.end()) primaries_.push_back({range.host, range.port});
      for (unsigned slot = range.first; slot <= range.last; ++slot) owner_[slot] = index;
    }
  }

  /// The primary serving `slot`, or nullopt when no node does.
  std::optional<Endpoint> owner(std::uint16_t slot) const {
    if (owner_[slot] == kNone) return {};
    return primaries_[owner_[slot]];
  }

  /// Every primary, each once.
  const std::vector<Endpoint>& primaries() const noexcept { return primaries_; }

 private:
  static constexpr std::uint16_t kNone = std::numeric_limits<std::uint16_t>::max();

  std::vector<SlotRange> ranges_;
  std::vector<Endpoint> primaries_;
  std::array<std::uint16_t, kClusterSlots> owner_{};
};

/// Whether a slot map reload is running; callers that need one meanwhile wait on `gate`, which
/// the reload cancels when it ends. Shared with the reloading coroutine's frame, which may be
/// destroyed after the client (an io_context shut down with the reload suspended).
struct Reload {
  explicit Reload(const asio::any_io_executor& executor) : gate(executor) {}
  bool running = false;
  asio::steady_timer gate;
};

class ReloadGuard {
 public:
  explicit ReloadGuard(std::shared_ptr<Reload> reload) : reload_(std::move(reload)) {
    reload_->running = true;
    reload_->gate.expires_at(asio::steady_timer::time_point::max());
  }
  ~ReloadGuard() {
    reload_->running = false;
    reload_->gate.cancel();
  }
  ReloadGuard(const ReloadGuard&) = delete;
  ReloadGuard& operator=(const ReloadGuard&) = delete;

 private:
  std::shared_ptr<Reload> reload_;
};

/// Undos that a node refused, waiting for a slot map that says where their keys live now.
/// Shared with the node connections' refusal handlers, which may outlive the routing.
struct UndoInbox {
  std::vector<Undo> undos;
  bool stale = false;  ///< a refusal said the map is out of date
};

class ClusterRouting final : public Routing {
 public:
  ClusterRouting(asio::any_io_executor executor, const config::Redis& options,
                 std::shared_ptr<core::PrimaryTracker> tracker)
      : executor_(executor),
        options_(options),
        tracker_(std::move(tracker)),
        reload_(std::make_shared<Reload>(executor)) {
    options_.db = 0;
    for (const auto& seed : options_.cluster) seeds_.push_back({seed.host, seed.port});
  }

  asio::awaitable<result<std::shared_ptr<RedisConnection>>> route(std::string_view key) override {
    if (std::exchange(inbox_->stale, false)) stale_ = true;
    if (stale_ || map_.empty()) co_await refresh(generation_);
    std::optional<Endpoint> target;
    if (key.empty()) {
      if (!map_.primaries().empty()) target = map_.primaries().front();
    } else {
      target = map_.owner(key_slot(key));
    }
    if (!target) {
      stale_ = true;  // a slot nobody owned when the map was read: ask again next time
      co_return make_error_code(store_errc::unavailable);
    }
    co_return connection(*target);
  }

  std::shared_ptr<RedisConnection> redirected(const Endpoint& to) override {
    return connection(to);
  }

  std::uint64_t generation() const override { return generation_; }

  asio::awaitable<void> moved(std::uint64_t seen) override { co_await refresh(seen); }

  void failed(const RedisConnection& node) override {
    (void)node;  // the node may have failed over: its slots are someone else's now
    stale_ = true;
  }

  bool follows_failover() const override { return true; }
  bool redirects() const override { return true; }

  asio::awaitable<std::string> probe(RedisClient& client) override {
    (void)client;
    if (stale_ || map_.empty()) co_await refresh(generation_);
    if (map_.empty()) co_return "redis cluster: no slot map from any node";
    const auto primaries = map_.primaries();
    for (const auto& primary : primaries) {
      auto node = connection(primary);
      auto r = co_await node->command("PING");
      const auto name = endpoint_text(primary.host, primary.port);
      if (!r) {
        stale_ = true;
        co_return "redis " + name + ": " + r.error().message();
      }
      if (!r->is_status("PONG")) co_return "redis " + name + ": " + r->str;
    }
    co_return std::string{};
  }

  asio::awaitable<std::vector<RedisClient::NodeReply>> on_each_primary(RedisClient& client,
                                                                       Command argv) override {
    (void)client;
    std::vector<RedisClient::NodeReply> out;
    if (stale_ || map_.empty()) co_await refresh(generation_);
    if (map_.empty()) {
      out.push_back({"redis cluster", make_error_code(store_errc::unavailable)});
      co_return out;
    }
    for (const auto& primary : map_.primaries()) {
      auto node = connection(primary);
      auto reply = co_await node->execute(argv);
      if (!reply) stale_ = true;
      out.push_back({endpoint_text(primary.host, primary.port), std::move(reply)});
    }
    co_return out;
  }

  std::uint64_t connect_count() const override {
    auto count = dropped_connects_;
    for (const auto& [name, node] : nodes_) count += node->connect_count();
    return count;
  }

 private:
  /// Reloads the slot map unless it was reloaded since generation `seen`; one reload at a time,
  /// concurrent callers wait for the running one. On failure the old map stays (stale).
  asio::awaitable<void> refresh(std::uint64_t seen) {
    while (reload_->running) {
      auto reload = reload_;
      co_await reload->gate.async_wait(use_nothrow);  // cancelled when the reload ends
      if (!reload->running) co_return;
    }
    if (generation_ != seen && !stale_) co_return;
    // Ends the reload however this coroutine ends: a caller cancelled mid-reload (the next
    // co_await throws) must not leave the others waiting forever.
    const ReloadGuard guard(reload_);

    // The node that answered last time first (a frozen seed then costs one timeout, not one
    // per reload), then the seeds, then the primaries known so far (the seeds may all be gone).
    std::vector<Endpoint> asked;
    if (last_answered_) asked.push_back(*last_answered_);
    asked.insert(asked.end(), seeds_.begin(), seeds_.end());
    for (const auto& primary : map_.primaries()) asked.push_back(primary);
    for (const auto& node : asked) {
      auto r = co_await connection(node)->command("CLUSTER", "SLOTS");
      if (!r || r->is_error()) continue;
      auto ranges = parse_cluster_slots(*r, node.host);
      if (!ranges || ranges->empty()) continue;
      last_answered_ = node;
      install(std::move(*ranges));
      break;
    }
  }

  void install(std::vector<SlotRange> ranges) {
    map_.assign(std::move(ranges));
    stale_ = false;
    ++generation_;
    // Connections to nodes that serve no slot any more (a failed-over primary) are dropped; a
    // command still running on one keeps it alive until it ends. Their undos go to the nodes
    // that serve those keys now, with those a node refused meanwhile.
    std::set<std::string> keep;
    for (const auto& p : map_.primaries()) keep.insert(endpoint_text(p.host, p.port));
    std::vector<Undo> homeless = std::exchange(inbox_->undos, {});
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      if (keep.contains(it->first)) {
        ++it;
      } else {
        dropped_connects_ += it->second->connect_count();
        for (auto& undo : it->second->take_undos()) homeless.push_back(std::move(undo));
        it = nodes_.erase(it);
      }
    }
    for (auto& undo : homeless) {
      if (const auto owner = map_.owner(key_slot(undo.key)))
        connection(*owner)->adopt_undos({std::move(undo)});
    }
    if (tracker_) {
      for (const auto& range : map_.ranges())
        tracker_->use(std::to_string(range.first), endpoint_text(range.host, range.port));
    }
  }

  std::shared_ptr<RedisConnection> connection(const Endpoint& node) {
    auto& slot = nodes_[endpoint_text(node.host, node.port)];
    if (!slot) {
      auto options = options_;
      options.address = node.host;
      options.port = node.port;
      slot = std::make_shared<RedisConnection>(executor_, std::move(options));
      // A refused undo (MOVED, READONLY, CLUSTERDOWN) waits for the next slot map, which the
      // next command loads, and goes to the node serving its key then.
      slot->on_refused_undo([inbox = std::weak_ptr<UndoInbox>(inbox_)](Undo undo, const Reply&) {
        auto box = inbox.lock();
        if (!box) return;
        box->stale = true;
        box->undos.push_back(std::move(undo));
      });
    }
    return slot;
  }

  asio::any_io_executor executor_;
  config::Redis options_;
  std::shared_ptr<core::PrimaryTracker> tracker_;
  std::vector<Endpoint> seeds_;
  std::optional<Endpoint> last_answered_;
  SlotMap map_;
  bool stale_ = false;
  std::uint64_t generation_ = 0;  // counts installed maps
  std::shared_ptr<Reload> reload_;
  std::map<std::string, std::shared_ptr<RedisConnection>> nodes_;  // by `host:port`
  std::uint64_t dropped_connects_ = 0;
  std::shared_ptr<UndoInbox> inbox_ = std::make_shared<UndoInbox>();
};

}  // namespace

std::uint16_t key_slot(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) % kClusterSlots);
}

std::optional<std::vector<SlotRange>> parse_cluster_slots(const Reply& reply,
                                                          const std::string& asked_host) {
  if (reply.kind != Reply::Kind::array) return {};
  std::vector<SlotRange> ranges;
  ranges.reserve(reply.elements.size());
  for (const auto& entry : reply.elements) {
    // [first, last, [host, port, id, …], replicas…]
    if (entry.kind != Reply::Kind::array || entry.elements.size() < 3) return {};
    const auto first = slot_number(entry.elements[0]);
    const auto last = slot_number(entry.elements[1]);
    const auto& primary = entry.elements[2];
    if (!first || !last || *first > *last) return {};
    if (primary.kind != Reply::Kind::array || primary.elements.size() < 2) return {};
    const auto& host = primary.elements[0];
    const auto& port = primary.elements[1];
    if (host.kind != Reply::Kind::string || port.kind != Reply::Kind::integer) return {};
    if (port.integer <= 0 || port.integer > std::numeric_limits<std::uint16_t>::max()) return {};
    ranges.push_back({*first, *last, host.str.empty() ? asked_host : host.str,
                      static_cast<std::uint16_t>(port.integer)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const SlotRange& a, const SlotRange& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first <= ranges[i - 1].last) return {};  // overlapping ranges
  }
  return ranges;
}

std::unique_ptr<Routing> cluster_routing(asio::any_io_executor executor,
                                         const config::Redis& options,
                                         std::shared_ptr<core::PrimaryTracker> tracker) {
  return std::make_unique<ClusterRouting>(std::move(executor), options, std::move(tracker));
}

}  // namespace idemgate::storage::redis
