#include "tests/support/local_stores.hpp"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/polling.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test {
namespace {

// initdb and a Postgres start on a loaded machine: a safety net against a hung script, not a
// measured bound.
constexpr std::chrono::seconds kScriptDeadline{180};

// The value of `export NAME=VALUE` in the script's output ("" when absent).
std::string exported(const std::string& output, const std::string& name) {
  std::istringstream lines(output);
  const std::string prefix = "export " + name + "=";
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with(prefix)) return line.substr(prefix.size());
  }
  return "";
}

}  // namespace

LocalStores::LocalStores()
    : script_(std::filesystem::path(require_env("IDEMGATE_SOURCE_DIR")) / "scripts" /
              "local-stores") {
  const std::string output = run({"start"});
  dir_ = exported(output, "IDEMGATE_STORES_DIR");
  pg_dsn_ = exported(output, "IDEMGATE_PG_DSN");
  payments_dsn_ = exported(output, "IDEMGATE_PAYMENTS_DSN");
  redis_address_ = exported(output, "IDEMGATE_REDIS_ADDR");
  if (dir_.empty() || pg_dsn_.empty() || payments_dsn_.empty() || redis_address_.empty()) {
    if (!dir_.empty()) run({"stop", dir_});
    throw std::runtime_error("local-stores start printed no complete set of exports:\n" + output);
  }
  ::setenv("IDEMGATE_STORES_DIR", dir_.c_str(), 1);
  ::setenv("IDEMGATE_PG_DSN", pg_dsn_.c_str(), 1);
  ::setenv("IDEMGATE_PAYMENTS_DSN", payments_dsn_.c_str(), 1);
  ::setenv("IDEMGATE_REDIS_ADDR", redis_address_.c_str(), 1);
}

LocalStores::~LocalStores() {
  thaw_pg();  // a stopped Postgres would not stop
  try {
    run({"stop", dir_});
  } catch (const std::exception&) {
    // Nothing more to do: the stores are private and the directory is under the temp dir.
  }
}

void LocalStores::stop_redis() {
  run({"stop-redis", dir_});
}

void LocalStores::start_redis() {
  run({"start-redis", dir_});
}

void LocalStores::stop_pg() {
  run({"stop-pg", dir_});
}

void LocalStores::start_pg() {
  run({"start-pg", dir_});
}

pid_t LocalStores::pid_in(const char* file) const {
  std::ifstream in(std::filesystem::path(dir_) / file);
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 0) throw std::runtime_error("no pid in " + dir_ + "/" + file);
  return pid;
}

pid_t LocalStores::redis_pid() const {
  return pid_in("redis.pid");
}

namespace {

/// The state letter of `pid` in /proc/PID/stat (it follows the command name in parentheses),
/// and its parent; state '\0' when the process is gone.
std::pair<char, pid_t> proc_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return {'\0', 0};
  std::istringstream rest(text.substr(paren + 2));
  char state = '\0';
  pid_t parent = 0;
  rest >> state >> parent;
  return {state, parent};
}

/// The processes whose parent is `pid` now.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t child = static_cast<pid_t>(std::stol(name));
    if (proc_state(child).second == pid) out.push_back(child);
  }
  return out;
}

void send(pid_t pid, int signo, const std::string& what) {
  if (::kill(pid, signo) != 0) {
    throw std::runtime_error(std::string(signo == SIGSTOP ? "SIGSTOP" : "SIGCONT") + " to " + what +
                             " " + std::to_string(pid) + " failed");
  }
}

/// Returns once every process of `pids` shows as stopped (T) or is gone.
void wait_stopped(const std::vector<pid_t>& pids, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + e2e::kEventDeadline;
  for (const pid_t pid : pids) {
    for (;;) {
      const char state = proc_state(pid).first;
      if (state == 'T' || state == '\0') break;
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(what + " " + std::to_string(pid) + " never showed as stopped");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

void LocalStores::freeze_redis() {
  const pid_t pid = redis_pid();
  send(pid, SIGSTOP, "Redis");
  wait_stopped({pid}, "Redis");
}

void LocalStores::thaw_redis() {
  send(redis_pid(), SIGCONT, "Redis");
}

void LocalStores::freeze_pg() {
  // The postmaster first: once it is stopped it forks no new backend to miss.
  const pid_t postmaster = pid_in("pg.pid");
  send(postmaster, SIGSTOP, "Postgres");
  std::vector<pid_t> all{postmaster};
  for (const pid_t child : children_of(postmaster)) {
    if (::kill(child, SIGSTOP) == 0) all.push_back(child);  // one may have just exited
  }
  wait_stopped(all, "Postgres process");
  frozen_pg_ = all;
}

void LocalStores::thaw_pg() {
  // Backends first, the postmaster last, the reverse of freeze_pg.
  for (auto it = frozen_pg_.rbegin(); it != frozen_pg_.rend(); ++it) ::kill(*it, SIGCONT);
  frozen_pg_.clear();
}

std::string LocalStores::run(const std::vector<std::string>& args) const {
  e2e::TempDir out;
  ChildOptions o;
  o.executable = "/bin/bash";
  o.args.push_back(script_.string());
  o.args.insert(o.args.end(), args.begin(), args.end());
  o.env = {{"IDEMGATE_PG_FSYNC", "off"}};
  o.stdout_path = (out.path() / "stdout").string();
  o.stderr_path = (out.path() / "stderr").string();
  ChildProcess child(o);
  const auto status = child.wait_for(kScriptDeadline);
  const std::string what = "local-stores " + args.front();
  if (!status) {
    child.stop();
    throw std::runtime_error(what + " did not finish in time; stderr:\n" +
                             read_text_file(o.stderr_path));
  }
  if (*status != 0) {
    throw std::runtime_error(what + " exited with " + std::to_string(*status) + "; stderr:\n" +
                             read_text_file(o.stderr_path));
  }
  return read_text_file(o.stdout_path);
}

PrivateStores::PrivateStores() {
  instance_ = std::make_unique<LocalStores>();
}

PrivateStores::~PrivateStores() {
  instance_.reset();
}

LocalStores& PrivateStores::stores() {
  if (!instance_) throw std::logic_error("the private stores are not running");
  return *instance_;
}

}  // namespace idemgate::test
