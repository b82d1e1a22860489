#include "tests/scale/redis_cluster.hpp"

#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "storage/redis/redis_cluster.hpp"

namespace idemgate::test::scale {
namespace {

using storage::redis::Reply;
using namespace std::chrono_literals;

/// How long a cluster may take to form or to agree after a change: a safety net against hangs.
constexpr auto kDeadline = 30s;
const std::string kHost = "127.0.0.1";

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const auto candidate = std::filesystem::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error(name + " not found on PATH");
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};

Reply sync_command(std::uint16_t port, const std::vector<std::string>& argv) {
  const timeval timeout{5, 0};
  std::unique_ptr<redisContext, ContextDeleter> c(
      redisConnectWithTimeout(kHost.c_str(), port, timeout));
  if (!c || c->err != 0) {
    throw std::runtime_error("cannot connect to redis on port " + std::to_string(port) + ": " +
                             (c ? c->errstr : "out of memory"));
  }
  redisSetTimeout(c.get(), timeout);
  std::vector<const char*> args;
  std::vector<std::size_t> lengths;
  for (const auto& a : argv) {
    args.push_back(a.data());
    lengths.push_back(a.size());
  }
  std::unique_ptr<redisReply, ReplyDeleter> reply(static_cast<redisReply*>(
      redisCommandArgv(c.get(), static_cast<int>(args.size()), args.data(), lengths.data())));
  if (!reply) throw std::runtime_error("redis on port " + std::to_string(port) + ": " + c->errstr);
  return storage::redis::copy_reply(*reply);
}

std::vector<storage::redis::SlotRange> slot_map(std::uint16_t port) {
  auto ranges =
      storage::redis::parse_cluster_slots(sync_command(port, {"CLUSTER", "SLOTS"}), kHost);
  if (!ranges) throw std::runtime_error("unexpected CLUSTER SLOTS reply");
  return *ranges;
}

bool same_map(const std::vector<storage::redis::SlotRange>& a,
              const std::vector<storage::redis::SlotRange>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].last != b[i].last || a[i].port != b[i].port) return false;
  }
  return true;
}

}  // namespace

RedisCluster::Node RedisCluster::start_node(const std::string& server) const {
  // free_port() probes: another process (a parallel suite's store, a cluster bus) may take the
  // port before redis-server binds it, and then answers in its place or resets. The node is
  // ours once it runs and answers CLUSTER MYID; otherwise it starts again on other ports.
  std::string failure;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Node node;
    node.port = free_port();
    // The bus port defaults to port + 10000, which may be taken or out of range.
    do {
      node.bus_port = free_port();
    } while (node.bus_port == node.port);
    const auto name = std::to_string(node.port);
    node.log_path = (dir_ / ("redis-" + name + ".log")).string();
    ChildOptions options;
    options.executable = server;
    options.args = {"--port",
                    name,
                    "--bind",
                    kHost,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    std::to_string(node.bus_port),
                    "--cluster-config-file",
                    (dir_ / ("nodes-" + name + ".conf")).string(),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--dir",
                    dir_.string(),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no"};
    options.stdout_path = node.log_path;
    options.stderr_path = node.log_path + ".err";
    node.process.emplace(options);
    if (!wait_for_port(kHost, node.port, kDeadline, &*node.process)) {
      failure = "redis-server did not start: " + read_text_file(node.log_path);
      continue;
    }
    try {
      node.id = sync_command(node.port, {"CLUSTER", "MYID"}).str;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!node.id.empty() && node.process->running()) return node;
    if (failure.empty()) failure = "redis-server on port " + name + " exited after starting";
  }
  throw std::runtime_error(failure + " (3 attempts)");
}

RedisCluster::RedisCluster(std::size_t primaries) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "idemgate-cluster-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;

  const auto server = find_in_path("redis-server");
  for (std::size_t i = 0; i < primaries; ++i) nodes_.push_back(start_node(server));
  std::vector<std::string> args = {"--cluster", "create"};
  for (const auto& node : nodes_) args.push_back(kHost + ":" + std::to_string(node.port));
  args.insert(args.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  run_cli(args, "cluster create");
  wait_until_agreed();
}

RedisCluster::~RedisCluster() {
  for (auto& node : nodes_) {
    if (node.process) node.process->stop(2s);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<config::Server> RedisCluster::seeds() const {
  std::vector<config::Server> out;
  for (const auto& node : nodes_) out.push_back({kHost, node.port});
  return out;
}

std::string RedisCluster::flow_text() const {
  std::string text = "{cluster: [";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (i != 0) text += ", ";
    text += "\"" + kHost + ":" + std::to_string(nodes_[i].port) + "\"";
  }
  return text + "]}";
}

Reply RedisCluster::command(std::size_t node, const std::vector<std::string>& argv) const {
  return sync_command(port(node), argv);
}

std::size_t RedisCluster::owner(std::uint16_t slot, std::size_t asked) const {
  const auto node = owners(asked).at(slot);
  if (node == nodes_.size()) throw std::runtime_error("no node owns slot " + std::to_string(slot));
  return node;
}

std::vector<std::size_t> RedisCluster::owners(std::size_t asked) const {
  std::vector<std::size_t> out(storage::redis::kClusterSlots, nodes_.size());
  for (const auto& range : slot_map(port(asked))) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].port != range.port) continue;
      for (unsigned slot = range.first; slot <= range.last; ++slot) out[slot] = i;
    }
  }
  return out;
}

bool RedisCluster::holds(std::size_t node, const std::string& key) const {
  const auto reply = command(node, {"EXISTS", key});
  return reply.kind == Reply::Kind::integer && reply.integer == 1;
}

void RedisCluster::reshard(std::size_t from, std::size_t to, int slots) {
  run_cli(
      {"--cluster", "reshard", kHost + ":" + std::to_string(port(from)), "--cluster-from", id(from),
       "--cluster-to", id(to), "--cluster-slots", std::to_string(slots), "--cluster-yes"},
      "cluster reshard");
  wait_until_agreed();
}

void RedisCluster::begin_migration(std::uint16_t slot, std::size_t from, std::size_t to) {
  const auto s = std::to_string(slot);
  const auto a = command(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", id(from)});
  const auto b = command(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", id(to)});
  if (!a.is_status("OK") || !b.is_status("OK"))
    throw std::runtime_error("CLUSTER SETSLOT failed: " + a.str + " / " + b.str);
}

void RedisCluster::migrate_key(const std::string& key, std::size_t from, std::size_t to) {
  const auto r = command(from, {"MIGRATE", kHost, std::to_string(port(to)), key, "0", "5000"});
  if (!r.is_status("OK")) throw std::runtime_error("MIGRATE failed: " + r.str);
}

void RedisCluster::end_migration(std::uint16_t slot, std::size_t to) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto r = command(i, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", id(to)});
    if (!r.is_status("OK")) throw std::runtime_error("CLUSTER SETSLOT NODE failed: " + r.str);
  }
  wait_until_agreed();
}

void RedisCluster::stop(std::size_t node) {
  if (nodes_.at(node).process) nodes_[node].process->stop(2s);
}

void RedisCluster::signal(std::size_t node, int signal) {
  if (nodes_.at(node).process) nodes_[node].process->signal(signal);
}

void RedisCluster::run_cli(const std::vector<std::string>& args, const std::string& what) const {
  const auto out = (dir_ / "redis-cli.out").string();
  ChildOptions options;
  options.executable = find_in_path("redis-cli");
  options.args = args;
  options.stdout_path = out;
  options.stderr_path = out + ".err";
  ChildProcess cli(options);
  const auto status =
      cli.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline));
  if (status != 0) {
    cli.stop(1s);
    throw std::runtime_error("redis-cli " + what + " failed:\n" + read_text_file(out) +
                             read_text_file(out + ".err"));
  }
}

void RedisCluster::wait_until_agreed() const {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    bool agreed = true;
    const auto first = slot_map(nodes_.front().port);
    for (const auto& node : nodes_) {
      const auto info = sync_command(node.port, {"CLUSTER", "INFO"});
      agreed = agreed && info.str.find("cluster_state:ok") != std::string::npos &&
               same_map(first, slot_map(node.port));
    }
    if (agreed && !first.empty()) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("the cluster nodes did not agree on a slot map in time");
    std::this_thread::sleep_for(20ms);  // gossip offers no event to wait on
  }
}

}  // namespace idemgate::test::scale
