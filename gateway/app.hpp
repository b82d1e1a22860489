#pragma once
// Wiring of the gateway process: logging, migrations, per-thread stores and handlers, signals.

#include <memory>
#include <string>

#include "gateway/config/config.hpp"

namespace idemgate {

/// Points spdlog's default logger at stderr, one JSON object a line (SPEC C32).
void setup_logging();

/// Applies pending Postgres schema migrations for `config` (blocking; start-up only).
/// Logs the outcome; false on failure.
bool run_migrations(const std::shared_ptr<const config::Config>& config);

/// `idemgate migrate --partitions N`: applies pending migrations, then converts
/// `idempotency_record` into N hash partitions by id (storage::pg::partition_records; blocking).
/// Logs the outcome. Returns the exit status: 0 converted, or already N hash partitions (a
/// no-op); 1 when the table is partitioned some other way (N cannot change in place) or the
/// database failed. Precondition: N in storage::pg::kMinRecordPartitions..kMaxRecordPartitions.
int run_partition_migration(const std::shared_ptr<const config::Config>& config, int partitions);

/// Runs the gateway in the foreground until SIGTERM/SIGINT (SPEC §1): loads `config_path`,
/// applies migrations when `migrate`, serves on config.threads io threads, reloads on SIGHUP
/// (an invalid file is logged and the running configuration kept), drains on stop.
/// Returns the process exit status: 0 clean shutdown, 2 bad configuration, 1 runtime failure.
int run_gateway(const std::string& config_path, bool migrate);

}  // namespace idemgate
