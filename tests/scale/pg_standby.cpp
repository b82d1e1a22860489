#include "tests/scale/pg_standby.hpp"

#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace idemgate::test::scale {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Promotion and replication offer no event a client can wait on: poll at this interval. Short,
// because promote_standby() measures the moment of the promotion with it.
constexpr auto kPollInterval = 5ms;
constexpr auto kToolDeadline = std::chrono::seconds(60);  // initdb, pg_basebackup, pg_ctl
const std::string kLoopback = "127.0.0.1";
const std::string kServerUser = "postgres";

bool running_as_root() {
  return ::geteuid() == 0;
}

/// The newest `/usr/lib/postgresql/N/bin` (Debian's layout, as scripts/local-stores finds it),
/// else the directory of `pg_ctl` on PATH.
std::string find_postgres_bin() {
  const std::filesystem::path root = "/usr/lib/postgresql";
  std::error_code ec;
  int best = -1;
  std::string found;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const auto bin = entry.path() / "bin";
    if (::access((bin / "pg_ctl").c_str(), X_OK) != 0) continue;
    if (std::stoi(name) > best) {
      best = std::stoi(name);
      found = bin.string();
    }
  }
  if (!found.empty()) return found;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (::access((std::filesystem::path(dir) / "pg_ctl").c_str(), X_OK) == 0) return dir;
  }
  throw std::runtime_error("no Postgres server binaries (install postgresql)");
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const auto candidate = std::filesystem::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  for (const char* fallback : {"/usr/bin", "/usr/sbin", "/bin", "/sbin"}) {
    const auto candidate = std::filesystem::path(fallback) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error(name + " not found (install util-linux)");
}

/// `program args…`, as the server user when running as root. setpriv executes the program in
/// its own process (runuser would fork and keep the child's PID from us).
ChildOptions as_server_user(const std::string& program, std::vector<std::string> args) {
  ChildOptions o;
  if (running_as_root()) {
    o.executable = find_on_path("setpriv");
    o.args = {"--reuid=" + kServerUser, "--regid=" + kServerUser, "--init-groups", "--", program};
    o.args.insert(o.args.end(), args.begin(), args.end());
  } else {
    o.executable = program;
    o.args = std::move(args);
  }
  return o;
}

/// Statements run in turn on one fresh connection (simple protocol, each its own transaction);
/// returns the first value of the last one's first row ("" for none). Throws
/// std::runtime_error when the connection or a statement fails.
std::string exec_each(const std::string& dsn, const std::vector<std::string>& statements) {
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdb(dsn.c_str()), &PQfinish);
  if (PQstatus(conn.get()) != CONNECTION_OK)
    throw std::runtime_error("cannot connect to " + dsn + ": " + PQerrorMessage(conn.get()));
  PQsetNoticeProcessor(
      conn.get(), [](void*, const char*) {}, nullptr);
  std::string value;
  for (const auto& sql : statements) {
    std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(conn.get(), sql.c_str()), &PQclear);
    const auto status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
      throw std::runtime_error(sql + ": " + PQresultErrorMessage(result.get()));
    value = PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
  }
  return value;
}

}  // namespace

struct PgStandbyPair::Server {
  std::string name;
  std::uint16_t port = 0;
  std::filesystem::path data;
  std::string log_path;
  std::unique_ptr<ChildProcess> process;
};

PgStandbyPair::PgStandbyPair()
    : bin_(find_postgres_bin()),
      primary_(std::make_unique<Server>()),
      standby_(std::make_unique<Server>()) {
  if (running_as_root()) {
    // The servers run as the server user and create their directories in ours.
    const passwd* user = ::getpwnam(kServerUser.c_str());
    if (!user) throw std::runtime_error("no '" + kServerUser + "' user to run Postgres as");
    if (::chown(dir_.path().c_str(), user->pw_uid, user->pw_gid) != 0)
      throw std::runtime_error("cannot hand " + dir_.path().string() + " to " + kServerUser);
  }
  primary_->name = "primary";
  primary_->port = free_port();
  primary_->data = dir_.path() / "primary";
  primary_->log_path = (dir_.path() / "primary.log").string();
  standby_->name = "standby";
  standby_->port = free_port();
  standby_->data = dir_.path() / "standby";
  standby_->log_path = (dir_.path() / "standby.log").string();

  run_tool("initdb",
           {"-D", primary_->data.string(), "-U", kServerUser, "-A", "trust", "-E", "UTF8",
            "--no-locale", "--no-sync"},
           "initdb.log");
  // synchronous_standby_names only on the primary's command line: the standby's copy of the
  // configuration does not carry it, so the promoted standby commits without a standby.
  start_server(*primary_, {"wal_level=replica", "max_wal_senders=4", "synchronous_commit=on",
                           "synchronous_standby_names=*"});
  // No standby yet to acknowledge: these commits are local on purpose.
  const std::string admin = dsn(primary_->port, "postgres", kServerUser);
  exec_each(admin, {"SET synchronous_commit = local", "CREATE ROLE idem LOGIN",
                    "CREATE DATABASE idem OWNER idem"});

  run_tool("pg_basebackup",
           {"-h", kLoopback, "-p", std::to_string(primary_->port), "-U", kServerUser, "-D",
            standby_->data.string(), "-R", "-X", "stream", "-c", "fast", "--no-sync"},
           "basebackup.log");
  // A standby that lost its primary retries streaming every wal_retrieve_retry_interval (5 s by
  // default) and acts on a promotion only after that wait.
  start_server(*standby_, {"hot_standby=on", "wal_retrieve_retry_interval=100ms"});
  wait_until_sync();
}

PgStandbyPair::~PgStandbyPair() {
  for (Server* server : {standby_.get(), primary_.get()}) {
    if (!server->process || !server->process->running()) continue;
    server->process->signal(SIGINT);  // fast shutdown
    if (!server->process->wait_for(10s)) server->process->stop(1s);
  }
}

std::uint16_t PgStandbyPair::primary_port() const {
  return primary_->port;
}

std::uint16_t PgStandbyPair::standby_port() const {
  return standby_->port;
}

std::string PgStandbyPair::primary_address() const {
  return kLoopback + ":" + std::to_string(primary_->port);
}

std::string PgStandbyPair::standby_address() const {
  return kLoopback + ":" + std::to_string(standby_->port);
}

std::string PgStandbyPair::multi_host_dsn(const std::string& database) const {
  return "postgresql://idem@" + primary_address() + "," + standby_address() + "/" + database +
         "?target_session_attrs=read-write";
}

std::string PgStandbyPair::dsn(std::uint16_t port, const std::string& database,
                               const std::string& user) const {
  return "postgresql://" + user + "@" + kLoopback + ":" + std::to_string(port) + "/" + database +
         "?connect_timeout=2";
}

void PgStandbyPair::run_tool(const std::string& program, std::vector<std::string> args,
                             const std::string& log_name) const {
  ChildOptions o = as_server_user(bin_ + "/" + program, std::move(args));
  o.stdout_path = (dir_.path() / log_name).string();
  o.stderr_path = o.stdout_path + ".err";
  // The server user cannot read root's home; libpq and initdb look there for files.
  o.env = {{"HOME", dir_.path().string()}};
  ChildProcess child(o);
  const auto status = child.wait_for(kToolDeadline);
  const int code = status ? *status : child.stop();
  if (code != 0) {
    throw std::runtime_error(program + " failed (status " + std::to_string(code) + "):\n" +
                             read_text_file(o.stdout_path) + read_text_file(o.stderr_path) +
                             diagnostics());
  }
}

void PgStandbyPair::start_server(Server& server, const std::vector<std::string>& settings) {
  std::vector<std::string> args = {"-D", server.data.string(),
                                   "-c", "listen_addresses=" + kLoopback,
                                   "-c", "port=" + std::to_string(server.port),
                                   "-c", "unix_socket_directories=" + dir_.path().string(),
                                   "-c", "fsync=off",
                                   "-c", "max_connections=100",
                                   "-c", "log_min_messages=warning"};
  for (const auto& s : settings) {
    args.push_back("-c");
    args.push_back(s);
  }
  ChildOptions o = as_server_user(bin_ + "/postgres", std::move(args));
  o.stderr_path = server.log_path;
  o.stdout_path = server.log_path + ".out";
  o.env = {{"HOME", dir_.path().string()}};
  server.process = std::make_unique<ChildProcess>(o);

  const std::string probe = dsn(server.port, "postgres", kServerUser);
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  while (PQping(probe.c_str()) != PQPING_OK) {
    if (!server.process->running())
      throw std::runtime_error("Postgres " + server.name + " exited at start\n" + diagnostics());
    if (Clock::now() > deadline)
      throw std::runtime_error("Postgres " + server.name + " did not start\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

void PgStandbyPair::wait_until_sync() const {
  const std::string admin = dsn(primary_->port, "postgres", kServerUser);
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  for (;;) {
    const std::string state = exec_each(
        admin,
        {"SELECT state || '/' || sync_state FROM pg_stat_replication ORDER BY sync_state LIMIT 1"});
    if (state == "streaming/sync") return;
    if (Clock::now() > deadline)
      throw std::runtime_error("the standby never became a synchronous one (last: '" + state +
                               "')\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

PgStandbyPair::Clock::time_point PgStandbyPair::kill_primary() {
  const auto killed = Clock::now();
  primary_->process->signal(SIGKILL);
  if (!primary_->process->wait_for(
          std::chrono::duration_cast<std::chrono::milliseconds>(e2e::kEventDeadline)))
    throw std::runtime_error("the killed primary did not exit\n" + diagnostics());
  return killed;
}

PgStandbyPair::Clock::time_point PgStandbyPair::promote_standby() {
  // -W: pg_ctl only asks; the poll below sees the moment itself, finer than pg_ctl's own wait
  // (which checks every 100 ms).
  run_tool("pg_ctl", {"promote", "-W", "-D", standby_->data.string()}, "promote.log");
  const std::string read_write = dsn(standby_->port) + "&target_session_attrs=read-write";
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  for (;;) {
    const auto attempt = Clock::now();
    std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdb(read_write.c_str()), &PQfinish);
    if (PQstatus(conn.get()) == CONNECTION_OK) return attempt;
    if (attempt > deadline)
      throw std::runtime_error("the standby never accepted a read-write session: " +
                               std::string(PQerrorMessage(conn.get())) + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

std::string PgStandbyPair::diagnostics() const {
  std::string out;
  for (const Server* server : {primary_.get(), standby_.get()}) {
    out += "--- Postgres " + server->name + " log (tail):\n" + e2e::file_tail(server->log_path);
  }
  return out;
}

}  // namespace idemgate::test::scale
