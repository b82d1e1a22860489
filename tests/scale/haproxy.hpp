#pragma once
// An L4 balancer on loopback for scale tests (SPEC C45): a real HAProxy in `mode tcp` in front of
// gateway instances, its health check on each instance's admin `/readyz`, and its stats socket
// to read what it thinks of each server.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::scale {

/// One server of the backend: where the traffic goes, and where the health check asks.
struct BalancedServer {
  std::string name;              ///< HAProxy's server name (`svname` in `show stat`)
  std::uint16_t port = 0;        ///< 127.0.0.1 port that receives the traffic (gateway listen)
  std::uint16_t check_port = 0;  ///< 127.0.0.1 port that answers the check (gateway admin)
};

/// A server's row of HAProxy's `show stat`.
struct ServerStat {
  /// `UP`, `DOWN`, `UP 1/2` (up, failing checks), `DOWN 1/2` (down, passing checks), `MAINT`…
  std::string status;
  /// The last check's result: `L7OK` (expected status), `L7STS` (another HTTP status),
  /// `L4CON` (connection refused), `L4TOUT`…; `INI` before the first check.
  std::string check_status;
  /// The HTTP status of the last layer-7 check; 0 when it had none.
  int check_code = 0;
  /// `stot`: connections HAProxy sent (or tried to send) to this server since it started.
  std::uint64_t sessions = 0;
};

/// `haproxy -f haproxy.cfg -db` (foreground) as a child process, with its config file, its stats
/// socket and its stderr in a temporary directory. The frontend listens on a free 127.0.0.1
/// port in `mode tcp` and balances connections round-robin over `servers`; each server is
/// checked with `option httpchk GET <check_path>` on its check_port, `http-check expect status
/// 200`, every `check_interval`, DOWN after `fall` failures, UP after `rise` successes. A
/// connection refused by a server is retried on another one (`retries 3`, `option redispatch
/// 1`). One thread (`nbthread 1`), so round-robin takes the servers strictly in turn.
///
/// The constructor returns once the frontend accepts connections and every server is UP after a
/// passing check; it throws std::runtime_error with HAProxy's stderr when that does not happen
/// within e2e::kEventDeadline (or the binary is missing: `haproxy` on PATH, /usr/sbin or
/// /usr/local/sbin). The destructor stops the process by PID and removes the directory.
///
/// @par Thread Safety
/// Use from the thread that created the object (the process is its child, see ChildProcess);
/// stats() and the waits may be called from any thread.
class Haproxy {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::string check_path = "/readyz";
    std::chrono::milliseconds check_interval{100};
    int fall = 1;
    int rise = 2;
  };

  explicit Haproxy(std::vector<BalancedServer> servers) : Haproxy(std::move(servers), Options{}) {}
  Haproxy(std::vector<BalancedServer> servers, Options options);
  ~Haproxy();
  Haproxy(const Haproxy&) = delete;
  Haproxy& operator=(const Haproxy&) = delete;

  /// The frontend's port on 127.0.0.1.
  std::uint16_t port() const { return port_; }
  /// The configuration file's text, for failure messages.
  const std::string& config_text() const { return config_; }

  /// `show stat` over the stats socket: each server of the backend by name. Throws
  /// std::runtime_error when the socket does not answer.
  std::map<std::string, ServerStat> stats() const;
  /// stats() of one server; throws std::runtime_error when there is no such server.
  ServerStat stat(const std::string& server) const;

  /// Polls stats() until `server`'s status is exactly `status` (e.g. "DOWN") and returns that
  /// row and the moment it was read; throws std::runtime_error after e2e::kEventDeadline.
  std::pair<ServerStat, Clock::time_point> wait_for_status(const std::string& server,
                                                           const std::string& status) const;

  /// HAProxy's stderr tail, labelled, for failure messages.
  std::string diagnostics() const;

 private:
  e2e::TempDir dir_;
  std::string config_;
  std::string socket_path_;
  std::string stderr_path_;
  std::vector<BalancedServer> servers_;
  std::uint16_t port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace idemgate::test::scale
