#include "tests/scale/pgbouncer.hpp"

#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace idemgate::test::scale {
namespace {

using namespace std::chrono_literals;

const std::string kLoopback = "127.0.0.1";
// PgBouncer refuses root; this is the user the Postgres of scripts/local-stores runs as too.
const char* const kServiceUser = "postgres";

/// The values a libpq DSN sets for host, port, user and dbname ("" when absent).
struct DsnParts {
  std::string host;
  std::string port;
  std::string user;
  std::string dbname;
};

DsnParts parse_dsn(const std::string& dsn) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(dsn.c_str(), &error);
  if (!options) {
    const std::string why = error ? error : "out of memory";
    PQfreemem(error);
    throw std::runtime_error("PgBouncer: cannot parse the Postgres DSN: " + why);
  }
  DsnParts parts;
  for (const PQconninfoOption* o = options; o->keyword; ++o) {
    const std::string keyword = o->keyword;
    const std::string value = o->val ? o->val : "";
    if (keyword == "host") parts.host = value;
    if (keyword == "port") parts.port = value;
    if (keyword == "user") parts.user = value;
    if (keyword == "dbname") parts.dbname = value;
  }
  PQconninfoFree(options);
  if (parts.host.empty() || parts.port.empty() || parts.user.empty() || parts.dbname.empty())
    throw std::runtime_error("PgBouncer: the Postgres DSN must name host, port, user and dbname");
  return parts;
}

}  // namespace

std::string find_pgbouncer() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const auto candidate = std::filesystem::path(dir) / "pgbouncer";
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  if (::access("/usr/sbin/pgbouncer", X_OK) == 0) return "/usr/sbin/pgbouncer";
  throw std::runtime_error("pgbouncer is neither on PATH nor /usr/sbin (install pgbouncer)");
}

std::pair<int, int> pgbouncer_version(const std::string& program) {
  e2e::TempDir out;
  ChildOptions o;
  o.executable = program;
  o.args = {"--version"};
  o.stdout_path = (out.path() / "stdout").string();
  o.stderr_path = (out.path() / "stderr").string();
  ChildProcess child(o);
  const auto status = child.wait_for(e2e::kEventDeadline);
  if (!status) child.stop();
  const std::string text = read_text_file(o.stdout_path);
  std::smatch m;
  static const std::regex version(R"(PgBouncer (\d+)\.(\d+))");
  if (status != 0 || !std::regex_search(text, m, version))
    throw std::runtime_error("pgbouncer --version printed no version:\n" + text +
                             read_text_file(o.stderr_path));
  return {std::stoi(m[1]), std::stoi(m[2])};
}

PgBouncer::PgBouncer(const std::string& postgres_dsn, Options options)
    : program_(find_pgbouncer()),
      config_path_((dir_.path() / "pgbouncer.ini").string()),
      port_(free_port()) {
  const DsnParts backend = parse_dsn(postgres_dsn);
  const auto [major, minor] = pgbouncer_version(program_);
  version_ = "PgBouncer " + std::to_string(major) + "." + std::to_string(minor);

  const auto userlist = dir_.path() / "userlist.txt";
  {
    std::ofstream users(userlist, std::ios::trunc);
    users << "\"" << backend.user << "\" \"\"\n";
  }
  std::ofstream ini(config_path_, std::ios::trunc);
  ini << "[databases]\n"
      << "* = host=" << backend.host << " port=" << backend.port << "\n"
      << "[pgbouncer]\n"
      << "listen_addr = " << kLoopback << "\n"
      << "listen_port = " << port_ << "\n"
      << "unix_socket_dir =\n"
      << "auth_type = trust\n"
      << "auth_file = " << userlist.string() << "\n"
      << "pool_mode = " << options.pool_mode << "\n"
      << "default_pool_size = " << options.default_pool_size << "\n"
      << "max_client_conn = 1000\n"
      << "server_round_robin = " << (options.server_round_robin ? 1 : 0) << "\n";
  if (major > 1 || (major == 1 && minor >= 21)) {
    // Off explicitly: a PgBouncer that tracks named statements per client would hide what
    // prepared_statements: false is for (SPEC C44).
    ini << "max_prepared_statements = 0\n";
  }
  ini.close();
  if (!ini) throw std::runtime_error("PgBouncer: cannot write " + config_path_);

  if (::geteuid() == 0) {
    const passwd* user = ::getpwnam(kServiceUser);
    if (!user) throw std::runtime_error("PgBouncer: no user 'postgres' to run as");
    if (::chown(dir_.path().c_str(), user->pw_uid, user->pw_gid) != 0)
      throw std::runtime_error("PgBouncer: cannot give " + dir_.path().string() + " to postgres");
  }
  dsn_ = "postgresql://" + backend.user + "@" + kLoopback + ":" + std::to_string(port_) + "/" +
         backend.dbname;
  start();
}

PgBouncer::~PgBouncer() {
  try {
    stop(2s);
  } catch (const std::exception&) {
    // ChildProcess's own destructor still kills it by PID.
  }
}

void PgBouncer::start() {
  if (child_ && child_->running()) return;
  ChildOptions o;
  o.executable = program_;
  if (::geteuid() == 0) o.args = {"-u", kServiceUser};
  o.args.push_back(config_path_);
  // One log per start: a restart must not truncate what the earlier run logged.
  const std::string log = log_path(++starts_);
  o.stderr_path = log;
  o.stdout_path = log + ".out";
  child_ = std::make_unique<ChildProcess>(o);
  if (!wait_for_port(kLoopback, port_, e2e::kEventDeadline, child_.get()))
    throw std::runtime_error("PgBouncer did not listen on port " + std::to_string(port_) + "\n" +
                             log_tail());
}

void PgBouncer::stop(std::chrono::milliseconds grace) {
  if (!child_ || !child_->running()) return;
  child_->signal(SIGINT);
  if (!child_->wait_for(grace)) child_->stop(0ms);
}

std::string PgBouncer::log_path(int start) const {
  return (dir_.path() / ("pgbouncer-" + std::to_string(start) + ".log")).string();
}

bool PgBouncer::running() {
  return child_ && child_->running();
}

std::string PgBouncer::log_tail(std::size_t lines) const {
  std::string out;
  for (int i = 1; i <= starts_; ++i) {
    out += "--- PgBouncer log (start " + std::to_string(i) + "):\n" +
           e2e::file_tail(log_path(i), lines);
  }
  return out;
}

}  // namespace idemgate::test::scale
