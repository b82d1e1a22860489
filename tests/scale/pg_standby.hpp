#pragma once
// A Postgres primary with a synchronous streaming standby on loopback, for failover tests
// (SPEC C43, C46): both servers are child processes of the test with their data in a temporary
// directory, so that a test may SIGKILL the primary and promote the standby.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::scale {

/// Two Postgres servers on free 127.0.0.1 ports, from the newest installed Postgres (the
/// `postgres`, `initdb`, `pg_basebackup` and `pg_ctl` binaries; as root they run as the
/// `postgres` user, which initdb requires):
/// - the primary: `wal_level=replica`, `synchronous_standby_names='*'`, `synchronous_commit=on`,
///   `fsync=off` (speed: the machine does not crash in a test, the processes do), with a login
///   role `idem` owning a database `idem`;
/// - the standby: `pg_basebackup -R` of the primary, streaming from it.
/// The constructor returns once the standby streams and the primary lists it as `sync`, so
/// every commit acknowledged from then on is on both servers. It throws std::runtime_error with
/// the servers' log tails when a step fails or e2e::kEventDeadline passes. The destructor stops
/// the servers still running by PID (fast shutdown, then SIGKILL) and removes the directory.
///
/// The promoted standby has no synchronous standby of its own: it commits alone.
///
/// @par Thread Safety
/// Use from the thread that created the object (the servers are its child processes).
class PgStandbyPair {
 public:
  using Clock = std::chrono::steady_clock;

  PgStandbyPair();
  ~PgStandbyPair();
  PgStandbyPair(const PgStandbyPair&) = delete;
  PgStandbyPair& operator=(const PgStandbyPair&) = delete;

  std::uint16_t primary_port() const;
  std::uint16_t standby_port() const;
  /// `127.0.0.1:PORT` of each server, as the gateway logs a Postgres host.
  std::string primary_address() const;
  std::string standby_address() const;

  /// `postgresql://idem@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/DATABASE?target_session_attrs=
  /// read-write`: libpq's multi-host form, which connects to whichever server takes writes.
  std::string multi_host_dsn(const std::string& database = "idem") const;
  /// A DSN for one server, as `user` (e.g. `postgres` to look at replication).
  std::string dsn(std::uint16_t port, const std::string& database = "idem",
                  const std::string& user = "idem") const;

  /// SIGKILLs the primary's postmaster (no shutdown: its backends end without acknowledging
  /// what the standby has not confirmed), waits until it is reaped, and returns when it was
  /// killed.
  Clock::time_point kill_primary();

  /// Promotes the standby (`pg_ctl promote`) and waits until it accepts a read-write session,
  /// polling every few milliseconds; returns when the poll that succeeded started (the moment
  /// SPEC C43 measures from, taken on the early side). Throws std::runtime_error after
  /// e2e::kEventDeadline.
  Clock::time_point promote_standby();

  /// The tails of both servers' logs, labelled, for failure messages.
  std::string diagnostics() const;

 private:
  struct Server;
  /// Runs a Postgres program to its end as the server user; throws with its output on failure.
  void run_tool(const std::string& program, std::vector<std::string> args,
                const std::string& log_name) const;
  void start_server(Server& server, const std::vector<std::string>& settings);
  void wait_until_sync() const;

  e2e::TempDir dir_;
  std::string bin_;
  std::unique_ptr<Server> primary_;
  std::unique_ptr<Server> standby_;
};

}  // namespace idemgate::test::scale
