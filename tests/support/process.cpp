#include "tests/support/process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

extern char** environ;

namespace idemgate::test {
namespace {

[[noreturn]] void throw_errno(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

int decode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Everything the child needs is built before fork(): after it, a multi-threaded parent's child
// may only make async-signal-safe calls.
struct ExecPlan {
  std::vector<std::string> strings;
  std::vector<char*> argv;
  std::vector<char*> envp;

  explicit ExecPlan(const ChildOptions& o) {
    std::vector<std::string> env_strings;
    for (char** e = environ; e && *e; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& [key, value] : o.env) overridden = overridden || key == name;
      if (!overridden) env_strings.push_back(entry);
    }
    for (const auto& [key, value] : o.env) env_strings.push_back(key + '=' + value);

    strings.push_back(o.executable);
    strings.insert(strings.end(), o.args.begin(), o.args.end());
    const std::size_t argc = strings.size();
    strings.insert(strings.end(), env_strings.begin(), env_strings.end());
    for (std::size_t i = 0; i < strings.size(); ++i)
      (i < argc ? argv : envp).push_back(strings[i].data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
  }
};

int open_output(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(errno, "cannot open " + path);
  return fd;
}

}  // namespace

ChildProcess::ChildProcess(const ChildOptions& options) {
  ExecPlan plan(options);
  const int err_fd = options.stderr_path.empty() ? -1 : open_output(options.stderr_path);
  const int out_fd = options.stdout_path.empty() ? -1 : open_output(options.stdout_path);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw_errno(errno, "pipe2");
  const pid_t parent = ::getpid();
  std::optional<rlim_t> open_files;
  if (options.open_files_limit) open_files = static_cast<rlim_t>(*options.open_files_limit);

  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    if (err_fd >= 0) ::dup2(err_fd, STDERR_FILENO);
    if (out_fd >= 0) ::dup2(out_fd, STDOUT_FILENO);
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    if (open_files) {
      const rlimit limit{*open_files, *open_files};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        const int error = errno;
        [[maybe_unused]] auto n = ::write(report[1], &error, sizeof error);
        ::_exit(127);
      }
    }
    // Start with default signal handling and nothing blocked, whatever the test runner set.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(plan.argv[0], plan.argv.data(), plan.envp.data());
    const int error = errno;
    [[maybe_unused]] auto n = ::write(report[1], &error, sizeof error);
    ::_exit(127);
  }
  const int fork_error = errno;
  ::close(report[1]);
  if (err_fd >= 0) ::close(err_fd);
  if (out_fd >= 0) ::close(out_fd);
  if (pid < 0) {
    ::close(report[0]);
    throw_errno(fork_error, "fork");
  }
  pid_ = pid;

  // The pipe closes at a successful exec (O_CLOEXEC), or carries exec's errno.
  int exec_error = 0;
  ssize_t n = 0;
  do {
    n = ::read(report[0], &exec_error, sizeof exec_error);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == static_cast<ssize_t>(sizeof exec_error)) {
    reap(true);
    throw_errno(exec_error, "cannot start " + options.executable);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) stop();
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), status_(other.status_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) stop();
    pid_ = std::exchange(other.pid_, -1);
    status_ = other.status_;
  }
  return *this;
}

bool ChildProcess::reap(bool block) {
  if (pid_ <= 0) return true;
  int wait_status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &wait_status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  status_ = r == pid_ ? decode(wait_status) : -1;
  pid_ = -1;
  return true;
}

bool ChildProcess::running() {
  return !reap(false);
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  // waitpid has no timeout; poll it, with the interval bounded by what is left.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reap(false)) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(10)));
  }
  return status_;
}

int ChildProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    if (!wait_for(grace)) {
      ::kill(pid_, SIGKILL);
      reap(true);
    }
  }
  return status_.value_or(-1);
}

void ChildProcess::signal(int signal) {
  if (pid_ > 0) ::kill(pid_, signal);
}

bool wait_for_port(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                   ChildProcess* child) {
  namespace asio = boost::asio;
  asio::io_context io;
  const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(host), port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    asio::ip::tcp::socket socket(io);
    boost::system::error_code ec;
    socket.connect(endpoint, ec);
    if (!ec) return true;
    if (child && !child->running()) return false;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    ::close(fd);
    throw_errno(error, "bind 127.0.0.1:0");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string require_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value)
    throw std::runtime_error(std::string("environment variable ") + name +
                             " is not set (scripts/local-stores start sets the store ones; "
                             "ctest sets IDEMGATE_BINARY_DIR)");
  return value;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace idemgate::test
