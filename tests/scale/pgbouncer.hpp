#pragma once
// A PgBouncer on loopback for scale tests (SPEC C44): one `pgbouncer` child process on a free
// 127.0.0.1 port, its configuration in a temporary directory, in front of a Postgres the test
// already runs (tests/support/local_stores.hpp), so that a test may put the gateway behind
// transaction pooling and stop and start the pooler under load.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::scale {

/// The `pgbouncer` program: found on PATH, else /usr/sbin/pgbouncer (Debian's package installs
/// it there, outside a non-root PATH). Throws std::runtime_error when neither exists.
std::string find_pgbouncer();

/// The version `pgbouncer --version` reports, as {major, minor} (1.18.0 → {1, 18}). Throws
/// std::runtime_error when the program fails or prints no version.
std::pair<int, int> pgbouncer_version(const std::string& program);

/// One PgBouncer in front of the Postgres a libpq DSN names (host, port, user and database are
/// read from it with PQconninfoParse). Configuration: `auth_type = trust` with the DSN's user in
/// its auth_file (the local stores' Postgres trusts loopback), every database forwarded to that
/// Postgres (`* = host=… port=…`), no Unix socket, `max_client_conn` 1000, and the pool as
/// Options says. PgBouncer 1.21 and later also get `max_prepared_statements = 0`, so that they
/// never track named statements for their clients (1.18–1.20 have no such tracking at all and
/// reject the setting).
///
/// PgBouncer refuses to run as root: a root test process starts it with `-u postgres` and gives
/// the directory to that user. The constructor returns once the port accepts connections; it
/// throws std::runtime_error with PgBouncer's log when that does not happen within
/// e2e::kEventDeadline. The destructor stops the process by PID (stop()) and removes the
/// directory.
///
/// @par Thread Safety
/// Use from the thread that created the object (the process is its child, see ChildProcess).
/// dsn(), port() and version() may be read from any thread.
class PgBouncer {
 public:
  struct Options {
    std::string pool_mode = "transaction";
    /// Server connections per database/user pair.
    int default_pool_size = 4;
    /// `server_round_robin = 1`: every transaction goes to the server connection idle longest
    /// instead of the one used last, so that consecutive transactions of one client land on
    /// different server sessions even without concurrent load.
    bool server_round_robin = false;
  };

  PgBouncer(const std::string& postgres_dsn, Options options);
  ~PgBouncer();
  PgBouncer(const PgBouncer&) = delete;
  PgBouncer& operator=(const PgBouncer&) = delete;

  /// The Postgres DSN with PgBouncer's address: `postgresql://USER@127.0.0.1:PORT/DATABASE`.
  const std::string& dsn() const { return dsn_; }
  std::uint16_t port() const { return port_; }
  /// `PgBouncer X.Y.Z`, the first line of `pgbouncer --version`.
  const std::string& version() const { return version_; }

  /// SIGINT (safe shutdown: transactions in progress finish, then every connection is closed),
  /// SIGKILL when the process has not exited after `grace`; returns once it is gone. A no-op
  /// when it is not running. The port stays reserved for start().
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  /// Starts the process again with the same configuration and port; returns once the port
  /// accepts connections. Throws std::runtime_error (with the log) when it does not.
  void start();
  bool running();

  /// The tail of PgBouncer's log (its stderr) of every start so far, for failure messages.
  std::string log_tail(std::size_t lines = 30) const;

 private:
  /// The log file of the `start`-th start (1 for the first).
  std::string log_path(int start) const;

  e2e::TempDir dir_;
  std::string program_;
  std::string version_;
  std::string config_path_;
  int starts_ = 0;
  std::uint16_t port_ = 0;
  std::string dsn_;
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace idemgate::test::scale
