#include "tests/scale/haproxy.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace idemgate::test::scale {
namespace {

using namespace std::chrono_literals;

// HAProxy offers no event for "listening" or "server state changed" to a client: poll.
constexpr auto kPollInterval = 10ms;

std::string find_haproxy() {
  const char* path = std::getenv("PATH");
  // Debian installs it in /usr/sbin, which a non-root PATH often lacks.
  std::istringstream dirs(std::string(path ? path : "") + ":/usr/sbin:/usr/local/sbin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const auto candidate = std::filesystem::path(dir) / "haproxy";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error("haproxy is not on PATH nor in /usr/sbin (install the haproxy package)");
}

std::string render(const std::vector<BalancedServer>& servers, const Haproxy::Options& options,
                   std::uint16_t port, const std::string& socket_path) {
  const std::string inter = std::to_string(options.check_interval.count()) + "ms";
  std::ostringstream c;
  c << "global\n"
    << "  nbthread 1\n"
    << "  stats socket " << socket_path << " mode 600 level admin\n"
    << "defaults\n"
    << "  mode tcp\n"
    << "  timeout connect 1s\n"
    << "  timeout client 60s\n"
    << "  timeout server 60s\n"
    << "  timeout check 2s\n"
    << "  retries 3\n"
    << "  option redispatch 1\n"
    << "frontend gateways\n"
    << "  bind " << e2e::kLoopback << ":" << port << "\n"
    << "  default_backend gateways\n"
    << "backend gateways\n"
    << "  balance roundrobin\n"
    << "  option httpchk GET " << options.check_path << "\n"
    << "  http-check expect status 200\n"
    << "  default-server inter " << inter << " fastinter " << inter << " downinter " << inter
    << " fall " << options.fall << " rise " << options.rise << "\n";
  for (const auto& s : servers) {
    c << "  server " << s.name << " " << e2e::kLoopback << ":" << s.port << " check port "
      << s.check_port << "\n";
  }
  return c.str();
}

/// Sends `command` to the unix socket at `path` and reads until HAProxy closes it.
std::string socket_command(const std::string& path, const std::string& command) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path))
    throw std::runtime_error("stats socket path too long: " + path);
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  timeval timeout{2, 0};  // HAProxy answers from memory; longer means it is gone or stuck
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
    throw std::runtime_error("connect " + path + ": " + std::strerror(errno));
  const std::string line = command + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("write " + path + ": " + std::strerror(errno));
  std::string out;
  std::array<char, 8192> chunk{};
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n == 0) return out;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("read " + path + ": " + std::strerror(errno));
    }
    out.append(chunk.data(), static_cast<std::size_t>(n));
  }
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

}  // namespace

Haproxy::Haproxy(std::vector<BalancedServer> servers, Options options)
    : socket_path_((dir_.path() / "haproxy.sock").string()),
      stderr_path_((dir_.path() / "haproxy.log").string()),
      servers_(std::move(servers)),
      port_(free_port()) {
  config_ = render(servers_, options, port_, socket_path_);
  const std::string config_path = (dir_.path() / "haproxy.cfg").string();
  {
    std::ofstream out(config_path);
    out << config_;
    if (!out) throw std::runtime_error("cannot write " + config_path);
  }
  ChildOptions o;
  o.executable = find_haproxy();
  o.args = {"-f", config_path, "-db"};
  o.stderr_path = stderr_path_;
  o.stdout_path = (dir_.path() / "haproxy.out").string();
  child_ = std::make_unique<ChildProcess>(o);
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(e2e::kEventDeadline);
  if (!wait_for_port(e2e::kLoopback, port_, timeout, child_.get()))
    throw std::runtime_error("haproxy did not accept on its frontend\n" + diagnostics());
  // Servers start UP before any check ran (check_status INI); wait for a passing check each.
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  for (;;) {
    bool all = true;
    // The frontend can accept before the stats socket is bound: until it is, ask again.
    std::map<std::string, ServerStat> rows;
    try {
      rows = stats();
    } catch (const std::runtime_error&) {
      all = false;
    }
    for (const auto& s : servers_) {
      const auto it = rows.find(s.name);
      all =
          all && it != rows.end() && it->second.status == "UP" && it->second.check_status == "L7OK";
    }
    if (all) return;
    if (Clock::now() > deadline || !child_->running())
      throw std::runtime_error("not every server passed a check\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

Haproxy::~Haproxy() {
  child_->stop();
}

std::map<std::string, ServerStat> Haproxy::stats() const {
  const std::string text = socket_command(socket_path_, "show stat");
  std::istringstream lines(text);
  std::string line;
  std::map<std::string, std::size_t> column;
  std::map<std::string, ServerStat> out;
  while (std::getline(lines, line)) {
    if (line.starts_with("# ")) {
      const auto names = split_csv(line.substr(2));
      for (std::size_t i = 0; i < names.size(); ++i) column[names[i]] = i;
      continue;
    }
    const auto cells = split_csv(line);
    const auto cell = [&](const char* name) -> std::string {
      const auto it = column.find(name);
      if (it == column.end())
        throw std::runtime_error(std::string("show stat has no column ") + name + ":\n" + text);
      return it->second < cells.size() ? cells[it->second] : "";
    };
    if (cells.size() < 2 || cell("pxname") != "gateways") continue;
    const std::string name = cell("svname");
    if (name == "FRONTEND" || name == "BACKEND") continue;
    ServerStat s;
    s.status = cell("status");
    s.check_status = cell("check_status");
    // A check that is running is reported with a leading `* `.
    if (s.check_status.starts_with("* ")) s.check_status.erase(0, 2);
    const std::string code = cell("check_code");
    s.check_code = code.empty() ? 0 : std::stoi(code);
    const std::string sessions = cell("stot");
    s.sessions = sessions.empty() ? 0 : std::stoull(sessions);
    out[name] = s;
  }
  if (column.empty()) throw std::runtime_error("show stat answered no header:\n" + text);
  return out;
}

ServerStat Haproxy::stat(const std::string& server) const {
  const auto rows = stats();
  const auto it = rows.find(server);
  if (it == rows.end()) throw std::runtime_error("haproxy has no server " + server);
  return it->second;
}

std::pair<ServerStat, Haproxy::Clock::time_point> Haproxy::wait_for_status(
    const std::string& server, const std::string& status) const {
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  for (;;) {
    const ServerStat s = stat(server);
    const auto now = Clock::now();
    if (s.status == status) return {s, now};
    if (now > deadline)
      throw std::runtime_error("haproxy server " + server + " stayed " + s.status + " (check " +
                               s.check_status + "), never " + status + "\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

std::string Haproxy::diagnostics() const {
  return "--- haproxy stderr (tail):\n" + e2e::file_tail(stderr_path_) + "--- haproxy.cfg:\n" +
         config_;
}

}  // namespace idemgate::test::scale
