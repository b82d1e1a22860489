#include "tests/scale/redis_sentinel.hpp"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace idemgate::test::scale {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Sentinels and replication offer no event a client can wait on: poll at this interval. Short,
// because wait_for_promotion() measures the moment of the promotion with it.
constexpr auto kPollInterval = 5ms;
// A sentinel answers from memory; a longer wait means it is stuck, and the poll goes on.
constexpr auto kProbeTimeout = 500ms;

const std::string kLoopback = "127.0.0.1";

std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const auto candidate = std::filesystem::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error(name + " is not on PATH (install redis-server)");
}

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

/// `SENTINEL replicas` and `SENTINEL sentinels` answer with one flat name/value array per
/// instance: the value of `field` in one of them ("" when absent).
std::string instance_field(const RedisValue& instance, const std::string& field) {
  for (std::size_t i = 0; i + 1 < instance.elements.size(); i += 2) {
    if (instance.elements[i].str == field) return instance.elements[i + 1].str;
  }
  return "";
}

/// The port a `SENTINEL get-master-addr-by-name` reply names; nullopt for nil or an error.
std::optional<std::uint16_t> named_port(const RedisValue& reply) {
  if (reply.kind != RedisValue::Kind::array || reply.elements.size() != 2) return std::nullopt;
  return static_cast<std::uint16_t>(std::stoi(reply.elements[1].str));
}

/// Calls `check` every kPollInterval until it returns true; throws with `what()` and
/// `diagnostics()` after `deadline`. Exceptions of `check` (a node not up yet) count as false.
void poll_until(Clock::duration timeout, const std::function<bool()>& check,
                const std::function<std::string()>& what,
                const std::function<std::string()>& diagnostics) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    try {
      if (check()) return;
    } catch (const std::runtime_error&) {
      // not reachable yet: poll again
    }
    if (Clock::now() > deadline)
      throw std::runtime_error("Sentinel topology: " + what() + "\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace

std::string describe_reply(const RedisValue& reply) {
  using Kind = RedisValue::Kind;
  switch (reply.kind) {
    case Kind::nil:
      return "(nil)";
    case Kind::integer:
      return std::to_string(reply.integer);
    case Kind::error:
      return "-" + reply.str;
    case Kind::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < reply.elements.size(); ++i) {
        if (i) out += ", ";
        out += describe_reply(reply.elements[i]);
      }
      return out + "]";
    }
    default:
      return reply.str;
  }
}

RedisValue redis_command(std::uint16_t port, const std::vector<std::string>& argv,
                         const std::string& password, std::chrono::milliseconds timeout) {
  const timeval tv = to_timeval(timeout);
  redisContext* context = redisConnectWithTimeout(kLoopback.c_str(), port, tv);
  const std::string where = kLoopback + ":" + std::to_string(port);
  if (!context || context->err) {
    const std::string error = context ? context->errstr : "out of memory";
    if (context) redisFree(context);
    throw std::runtime_error("cannot connect to Redis at " + where + ": " + error);
  }
  std::unique_ptr<redisContext, decltype(&redisFree)> owner(context, &redisFree);
  redisSetTimeout(context, tv);
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<const char*> data;
    std::vector<std::size_t> lengths;
    for (const auto& a : args) {
      data.push_back(a.data());
      lengths.push_back(a.size());
    }
    auto* raw = static_cast<redisReply*>(
        redisCommandArgv(context, static_cast<int>(args.size()), data.data(), lengths.data()));
    if (!raw) throw std::runtime_error("Redis at " + where + ": " + context->errstr);
    RedisValue v = storage::redis::copy_reply(*raw);
    freeReplyObject(raw);
    return v;
  };
  if (!password.empty()) {
    const RedisValue auth = run({"AUTH", password});
    if (auth.kind == RedisValue::Kind::error)
      throw std::runtime_error("AUTH at " + where + ": " + auth.str);
  }
  return run(argv);
}

std::optional<std::string> info_field(const std::string& info, const std::string& field) {
  std::istringstream lines(info);
  std::string line;
  const std::string prefix = field + ":";
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with(prefix)) return line.substr(prefix.size());
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------

struct SentinelTopology::Node {
  std::string name;
  std::uint16_t port = 0;
  std::filesystem::path dir;
  std::string log_path;
  std::unique_ptr<ChildProcess> child;
};

SentinelTopology::SentinelTopology(Options options)
    : options_(std::move(options)), redis_server_(find_program("redis-server")) {
  for (const char* name : {"node-a", "node-b"}) {
    auto node = std::make_unique<Node>();
    node->name = name;
    node->port = free_port();
    nodes_.push_back(std::move(node));
  }
  for (const char* name : {"sentinel-1", "sentinel-2", "sentinel-3"}) {
    auto node = std::make_unique<Node>();
    node->name = name;
    node->port = free_port();
    sentinels_.push_back(std::move(node));
  }
  try {
    start_data_node(*nodes_[0], std::nullopt);
    start_data_node(*nodes_[1], nodes_[0]->port);
    wait_until_in_sync(*nodes_[1]);
    const std::uint16_t monitored = options_.monitor_replica ? nodes_[1]->port : nodes_[0]->port;
    for (auto& s : sentinels_) start_sentinel(*s, monitored);
    wait_until_sentinels_ready(monitored, !options_.monitor_replica);
  } catch (...) {
    // The destructor does not run for a constructor that throws: stop what was started.
    for (auto& s : sentinels_)
      if (s->child) s->child->stop(2s);
    for (auto& n : nodes_)
      if (n->child) n->child->stop(2s);
    throw;
  }
}

SentinelTopology::~SentinelTopology() {
  for (auto& s : sentinels_)
    if (s->child) s->child->stop(2s);
  for (auto& n : nodes_)
    if (n->child) n->child->stop(2s);
}

std::vector<std::string> SentinelTopology::sentinel_addresses() const {
  std::vector<std::string> out;
  for (const auto& s : sentinels_) out.push_back(kLoopback + ":" + std::to_string(s->port));
  return out;
}

config::Redis SentinelTopology::redis_options() const {
  config::Redis o;
  o.mode = config::Redis::Mode::sentinel;
  for (const auto& s : sentinels_) o.sentinels.push_back({kLoopback, s->port});
  o.master_name = options_.master_name;
  o.password = options_.password;
  o.sentinel_password = options_.sentinel_password;
  return o;
}

std::string SentinelTopology::gateway_redis() const {
  std::string out = "sentinels: [";
  const auto addresses = sentinel_addresses();
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    if (i) out += ", ";
    out += "\"" + addresses[i] + "\"";
  }
  out += "], master_name: " + options_.master_name;
  if (!options_.password.empty()) out += ", password: " + options_.password;
  if (!options_.sentinel_password.empty())
    out += ", sentinel_password: " + options_.sentinel_password;
  return out;
}

std::uint16_t SentinelTopology::primary_port() const {
  return nodes_[primary_]->port;
}

std::uint16_t SentinelTopology::replica_port() const {
  return nodes_[1 - primary_]->port;
}

std::string SentinelTopology::primary_address() const {
  return kLoopback + ":" + std::to_string(primary_port());
}

std::string SentinelTopology::replica_address() const {
  return kLoopback + ":" + std::to_string(replica_port());
}

RedisValue SentinelTopology::node_command(std::uint16_t port,
                                          const std::vector<std::string>& argv) const {
  return redis_command(port, argv, options_.password);
}

RedisValue SentinelTopology::sentinel_command(std::size_t index,
                                              const std::vector<std::string>& argv) const {
  return redis_command(sentinels_.at(index)->port, argv, options_.sentinel_password, kProbeTimeout);
}

void SentinelTopology::signal_node(std::uint16_t port, int signo) {
  for (auto& node : nodes_) {
    if (node->port == port && node->child) {
      node->child->signal(signo);
      return;
    }
  }
  throw std::logic_error("no data node listens on port " + std::to_string(port));
}

void SentinelTopology::signal_sentinels(int signo) {
  for (auto& sentinel : sentinels_) {
    if (sentinel->child) sentinel->child->signal(signo);
  }
}

SentinelTopology::Clock::time_point SentinelTopology::kill_primary() {
  Node& primary = *nodes_[primary_];
  primary.child->signal(SIGKILL);
  const auto at = Clock::now();
  primary.child->wait_for(e2e::kEventDeadline);  // reap it: the port is free again
  return at;
}

SentinelTopology::Clock::time_point SentinelTopology::wait_for_promotion() {
  const std::uint16_t candidate = replica_port();
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  for (;;) {
    bool named = false;
    for (std::size_t i = 0; i < sentinels_.size() && !named; ++i) {
      try {
        named = named_port(sentinel_command(
                    i, {"SENTINEL", "get-master-addr-by-name", options_.master_name})) == candidate;
      } catch (const std::runtime_error&) {
        // a sentinel that does not answer now is asked again on the next round
      }
    }
    if (named) {
      try {
        const RedisValue role =
            redis_command(candidate, {"ROLE"}, options_.password, kProbeTimeout);
        if (!role.elements.empty() && role.elements[0].str == "master") {
          const auto promoted = Clock::now();
          primary_ = 1 - primary_;
          return promoted;
        }
      } catch (const std::runtime_error&) {
        // not answering: the promotion is not complete
      }
    }
    if (Clock::now() > deadline)
      throw std::runtime_error("Sentinel topology: no sentinel promoted 127.0.0.1:" +
                               std::to_string(candidate) + " in time\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

SentinelTopology::Clock::time_point SentinelTopology::wait_until_all_sentinels_agree() {
  std::vector<bool> named(sentinels_.size(), false);
  std::string last;
  poll_until(
      e2e::kEventDeadline,
      [&] {
        for (std::size_t i = 0; i < sentinels_.size(); ++i) {
          if (named[i]) continue;
          const RedisValue reply =
              sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", options_.master_name});
          last = sentinels_[i]->name + " names " + describe_reply(reply);
          named[i] = named_port(reply) == primary_port();
        }
        return std::find(named.begin(), named.end(), false) == named.end();
      },
      [&] { return "the sentinels do not agree on the new primary: " + last; },
      [&] { return diagnostics(); });
  return Clock::now();
}

void SentinelTopology::restart_old_primary() {
  Node& old = *nodes_[1 - primary_];
  old.child.reset();
  start_data_node(old, primary_port());
  wait_until_in_sync(old);
}

std::string SentinelTopology::diagnostics() const {
  std::string out;
  for (const auto* group : {&nodes_, &sentinels_}) {
    for (const auto& n : *group) {
      out += "--- " + n->name + " (port " + std::to_string(n->port) + ") log:\n" +
             e2e::file_tail(n->log_path, 15);
    }
  }
  return out;
}

void SentinelTopology::start_data_node(Node& node, std::optional<std::uint16_t> replica_of) {
  node.dir = dir_.path() / node.name;
  std::filesystem::create_directories(node.dir);
  node.log_path = (node.dir / "redis.log").string();
  const auto conf = node.dir / "redis.conf";
  std::ofstream out(conf, std::ios::trunc);
  out << "bind 127.0.0.1\n"
      << "port " << node.port << "\n"
      << "dir " << node.dir.string() << "\n"
      << "logfile " << node.log_path << "\n"
      << "save \"\"\n"
      << "appendonly no\n"
      // A full sync starts at once instead of waiting for more replicas (7.0 waits 5 s).
      << "repl-diskless-sync yes\n"
      << "repl-diskless-sync-delay 0\n";
  if (!options_.password.empty()) {
    out << "requirepass " << options_.password << "\n"
        << "masterauth " << options_.password << "\n";
  }
  if (replica_of) out << "replicaof 127.0.0.1 " << *replica_of << "\n";
  out.close();
  ChildOptions o;
  o.executable = redis_server_;
  o.args = {conf.string()};
  o.stdout_path = (node.dir / "stdout").string();
  o.stderr_path = (node.dir / "stderr").string();
  node.child = std::make_unique<ChildProcess>(o);
  if (!wait_for_port(kLoopback, node.port, e2e::kEventDeadline, node.child.get()))
    throw std::runtime_error("Sentinel topology: " + node.name + " did not listen\n" +
                             read_text_file(o.stderr_path) + diagnostics());
}

void SentinelTopology::start_sentinel(Node& node, std::uint16_t monitored_port) {
  node.dir = dir_.path() / node.name;
  std::filesystem::create_directories(node.dir);
  node.log_path = (node.dir / "sentinel.log").string();
  const auto conf = node.dir / "sentinel.conf";  // the sentinel rewrites it: writable, private
  const std::string& name = options_.master_name;
  std::ofstream out(conf, std::ios::trunc);
  out << "bind 127.0.0.1\n"
      << "port " << node.port << "\n"
      << "dir " << node.dir.string() << "\n"
      << "logfile " << node.log_path << "\n"
      << "sentinel resolve-hostnames no\n"
      << "sentinel monitor " << name << " 127.0.0.1 " << monitored_port << " 2\n"
      << "sentinel down-after-milliseconds " << name << " 1000\n"
      << "sentinel failover-timeout " << name << " 3000\n"
      << "sentinel parallel-syncs " << name << " 1\n";
  if (!options_.password.empty())
    out << "sentinel auth-pass " << name << " " << options_.password << "\n";
  if (!options_.sentinel_password.empty()) {
    out << "requirepass " << options_.sentinel_password << "\n"
        << "sentinel sentinel-pass " << options_.sentinel_password << "\n";
  }
  out.close();
  ChildOptions o;
  o.executable = redis_server_;  // `redis-sentinel` is the same program, not always installed
  o.args = {conf.string(), "--sentinel"};
  o.stdout_path = (node.dir / "stdout").string();
  o.stderr_path = (node.dir / "stderr").string();
  node.child = std::make_unique<ChildProcess>(o);
  if (!wait_for_port(kLoopback, node.port, e2e::kEventDeadline, node.child.get()))
    throw std::runtime_error("Sentinel topology: " + node.name + " did not listen\n" +
                             read_text_file(o.stderr_path) + diagnostics());
}

void SentinelTopology::wait_until_in_sync(const Node& replica) {
  std::string last;
  poll_until(
      e2e::kEventDeadline,
      [&] {
        last = node_command(replica.port, {"INFO", "replication"}).str;
        return info_field(last, "master_link_status") == "up";
      },
      [&] { return replica.name + " never got in sync; INFO replication:\n" + last; },
      [&] { return diagnostics(); });
}

void SentinelTopology::wait_until_sentinels_ready(std::uint16_t monitored_port, bool full) {
  const std::string& name = options_.master_name;
  const std::uint16_t replica = nodes_[1]->port;
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    std::string last;
    poll_until(
        e2e::kEventDeadline,
        [&] {
          const RedisValue master =
              sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", name});
          last = "master " + describe_reply(master);
          if (named_port(master) != monitored_port) return false;
          if (!full) return true;
          const RedisValue replicas = sentinel_command(i, {"SENTINEL", "replicas", name});
          last += "; replicas " + describe_reply(replicas);
          bool knows_replica = false;
          for (const auto& r : replicas.elements) {
            const std::string flags = instance_field(r, "flags");
            knows_replica |= instance_field(r, "port") == std::to_string(replica) &&
                             flags.find("down") == std::string::npos &&
                             flags.find("disconnected") == std::string::npos &&
                             instance_field(r, "master-link-status") == "ok";
          }
          if (!knows_replica) return false;
          const RedisValue others = sentinel_command(i, {"SENTINEL", "sentinels", name});
          last += "; sentinels " + describe_reply(others);
          return others.elements.size() == sentinels_.size() - 1;
        },
        [&] { return sentinels_[i]->name + " is not ready; last answers: " + last; },
        [&] { return diagnostics(); });
  }
}

}  // namespace idemgate::test::scale
