#include "tests/support/local_stores.hpp"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

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

pid_t LocalStores::redis_pid() const {
  std::ifstream file(std::filesystem::path(dir_) / "redis.pid");
  pid_t pid = 0;
  if (!(file >> pid) || pid <= 0)
    throw std::runtime_error("no Redis pid in " + dir_ + "/redis.pid");
  return pid;
}

void LocalStores::freeze_redis() {
  const pid_t pid = redis_pid();
  if (::kill(pid, SIGSTOP) != 0)
    throw std::runtime_error("SIGSTOP to Redis " + std::to_string(pid) + " failed");
  // The state letter follows the command name in parentheses: T once the process is stopped.
  const bool stopped = eventually(
      [&] {
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        const auto paren = text.rfind(')');
        return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T';
      },
      std::chrono::milliseconds(1));
  if (!stopped)
    throw std::runtime_error("Redis " + std::to_string(pid) + " never showed as stopped");
}

void LocalStores::thaw_redis() {
  const pid_t pid = redis_pid();
  if (::kill(pid, SIGCONT) != 0)
    throw std::runtime_error("SIGCONT to Redis " + std::to_string(pid) + " failed");
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
