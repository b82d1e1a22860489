#pragma once
// Child processes for end-to-end tests: start a binary with arguments and environment, capture
// its stderr in a file, wait until it accepts TCP connections, stop it by PID.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idemgate::test {

/// What to start.
struct ChildOptions {
  std::string executable;         ///< path of the binary (no PATH search)
  std::vector<std::string> args;  ///< argv[1…]
  /// Set (or override) in the child on top of the parent's environment.
  std::vector<std::pair<std::string, std::string>> env;
  std::string stderr_path;  ///< file that receives the child's stderr (truncated); "" inherits
  std::string stdout_path;  ///< file that receives the child's stdout (truncated); "" inherits
  /// When set, the child's RLIMIT_NOFILE, soft and hard (set in the child before exec), e.g. to
  /// run a gateway out of descriptors (SPEC C52).
  std::optional<unsigned long> open_files_limit;
};

/// A running child process, owned by this object: the destructor stops it (stop()).
///
/// The child gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG), so a
/// crashed or killed test run leaves no process behind; start children from a thread that
/// outlives them (the test's main thread). File descriptors other than 0–2 are not inherited.
///
/// @par Thread Safety
/// One object is used by one thread at a time.
class ChildProcess {
 public:
  /// Forks and executes `options.executable`. Throws std::system_error when fork, the output
  /// files or exec fail (an exec failure is reported from the child through a pipe).
  explicit ChildProcess(const ChildOptions& options);
  ~ChildProcess();
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The child's process id; -1 after it was reaped.
  pid_t pid() const { return pid_; }

  /// True while the child has not exited (reaps it when it has).
  bool running();

  /// Waits up to `timeout` for the child to exit on its own. Returns its exit status (see
  /// stop()) or nullopt when it is still running.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);

  /// SIGTERM, then SIGKILL if it has not exited after `grace`. Returns the exit status: the
  /// exit code, or 128 + signal number when a signal ended it. Idempotent: later calls return
  /// the same status.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

  /// Sends `signal` to the child (e.g. SIGKILL to simulate a crash, SIGSTOP to freeze it).
  void signal(int signal);

 private:
  bool reap(bool block);

  pid_t pid_ = -1;
  std::optional<int> status_;
};

/// Tries to connect to `host:port` until a connection succeeds (true), `timeout` passes
/// (false), or `child` (when given) exits (false). Polls every 20 ms: a child that only
/// announces readiness by listening offers no event to wait on.
bool wait_for_port(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                   ChildProcess* child = nullptr);

/// A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0 and released), for a
/// child that needs its port on the command line. Throws std::system_error.
std::uint16_t free_port();

/// The value of environment variable `name`; throws std::runtime_error naming it when unset or
/// empty (tests that need a store fail rather than skip, STYLE).
std::string require_env(const char* name);

/// The whole content of a file ("" when it cannot be read), e.g. a child's captured stderr.
std::string read_text_file(const std::string& path);

}  // namespace idemgate::test
