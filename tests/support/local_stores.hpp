#pragma once
// Private Postgres and Redis for the fault and scale suites, run by the repository's own
// `scripts/local-stores`, so that a test may stop, start, stall and disturb them without touching
// anyone else's stores.

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace idemgate::test {

/// One `scripts/local-stores start` on free loopback ports (Postgres with fsync off), stopped
/// with `local-stores stop DIR` by the destructor.
///
/// The constructor exports IDEMGATE_STORES_DIR, IDEMGATE_PG_DSN, IDEMGATE_PAYMENTS_DSN and
/// IDEMGATE_REDIS_ADDR into this process's environment (overriding any values already there),
/// so the e2e fixture and every child process it starts use these stores. The script is found
/// at $IDEMGATE_SOURCE_DIR/scripts/local-stores and run with /bin/bash.
///
/// Every member throws std::runtime_error with the script's stderr when the script fails or
/// takes longer than kScriptDeadline.
///
/// @par Thread Safety
/// Use from the thread that created the object (the script runs as its child process).
class LocalStores {
 public:
  LocalStores();
  ~LocalStores();
  LocalStores(const LocalStores&) = delete;
  LocalStores& operator=(const LocalStores&) = delete;

  /// Stops Redis (SIGTERM) and waits until its process is gone; the port stays reserved.
  void stop_redis();
  /// Starts Redis again on the same port and waits until it accepts connections.
  void start_redis();
  /// Stops Postgres (fast shutdown: sessions are ended) and waits until it is gone.
  void stop_pg();
  /// Starts Postgres again on the same port and waits until it accepts connections.
  void start_pg();
  /// Freezes Redis (SIGSTOP) and returns once the kernel reports it stopped: connections are
  /// still accepted, but nothing is answered until thaw_redis(). The stall lasts exactly as long
  /// as the test wants, with no clock involved.
  void freeze_redis();
  /// Resumes a frozen Redis (SIGCONT).
  void thaw_redis();
  /// Freezes Postgres (SIGSTOP to the postmaster, then to every process it runs) and returns once
  /// all of them are stopped: connections and statements hang, nothing answers, until
  /// thaw_pg(). A frozen Postgres is thawed by the destructor.
  void freeze_pg();
  /// Resumes a frozen Postgres (SIGCONT), its backends before the postmaster.
  void thaw_pg();

  const std::string& dir() const { return dir_; }
  const std::string& pg_dsn() const { return pg_dsn_; }
  const std::string& payments_dsn() const { return payments_dsn_; }
  /// `127.0.0.1:PORT`.
  const std::string& redis_address() const { return redis_address_; }

 private:
  /// Runs the script with `args`; returns its stdout.
  std::string run(const std::vector<std::string>& args) const;
  /// The process id in DIR/`file` (redis.pid, pg.pid). Throws when there is none.
  pid_t pid_in(const char* file) const;
  /// The process id in DIR/redis.pid (the script's Redis). Throws when there is none.
  pid_t redis_pid() const;

  std::filesystem::path script_;
  std::string dir_;
  std::string pg_dsn_;
  std::string payments_dsn_;
  std::string redis_address_;
  std::vector<pid_t> frozen_pg_;  ///< stopped by freeze_pg, in the order they were stopped
};

/// One LocalStores for a whole test binary, as a Boost.Test global fixture
/// (`BOOST_TEST_GLOBAL_FIXTURE(PrivateStores)`): started before the first case, stopped after the
/// last, so that the binary needs no store variables and shares no store with other suites.
class PrivateStores {
 public:
  PrivateStores();
  ~PrivateStores();
  PrivateStores(const PrivateStores&) = delete;
  PrivateStores& operator=(const PrivateStores&) = delete;

  /// The running stores. Throws std::logic_error outside the fixture's lifetime.
  static LocalStores& stores();

 private:
  static inline std::unique_ptr<LocalStores> instance_;
};

}  // namespace idemgate::test
