// idemgate command line (SPEC §1).

#include <boost/program_options.hpp>
#include <csignal>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "gateway/admin/keys_command.hpp"
#include "gateway/admin/readiness_report.hpp"
#include "gateway/app.hpp"
#include "gateway/config/config_loader.hpp"
#include "gateway/version.hpp"
#include "storage/pg/migrations.hpp"

namespace po = boost::program_options;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage = R"(usage:
  idemgate --config FILE [--no-migrate]   run the gateway in the foreground
  idemgate check-config FILE              validate a configuration file
  idemgate check-config --stores FILE     validate it, then connect to its stores and print each
                                          store check with its verdict (exit 1: a check failed
                                          or a store does not answer; warnings are allowed)
  idemgate migrate --config FILE [--partitions N]
                                          apply the Postgres schema migrations and exit; with
                                          --partitions N (2-1024), then convert idempotency_record
                                          into N hash partitions by id, moving its rows (an
                                          exclusive lock for the copy's duration). Opt-in, once:
                                          the same N again does nothing, another N is refused
  idemgate keys show --config FILE --route NAME [--scope-header 'Name: value']... KEY...
                                          print the stored record for a key (exit 1: not found)
  idemgate keys purge --config FILE --route NAME [--scope-header 'Name: value']... KEY...
                                          delete the record and the in-flight lock for a key
  idemgate --version | --help

Logs go to stderr, one JSON object a line. Exit status: 0 clean shutdown, 2 bad configuration
or arguments, 1 runtime failure. SIGTERM/SIGINT drain and stop; SIGHUP reloads the configuration.
)";

}  // namespace

int main(int argc, char** argv) {
  // hiredis writes with write(2): a peer that went away must give EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  po::options_description options("options");
  options.add_options()("config,c", po::value<std::string>(), "configuration file (YAML)")(
      "no-migrate", "do not apply pending schema migrations at start")(
      "stores", "check-config: also check the stores' settings (SPEC C58)")(
      "partitions", po::value<int>(), "migrate: hash-partition idempotency_record into N")(
      "version", "print the version")("help,h", "print this help")(
      "route", po::value<std::string>(), "keys: the route whose record to look at")(
      "scope-header", po::value<std::vector<std::string>>()->composing(),
      "keys: a key_scope header as 'Name: value' (repeatable)")(
      "command", po::value<std::vector<std::string>>(), "check-config FILE | migrate | keys");
  po::positional_options_description positional;
  positional.add("command", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "idemgate: " << e.what() << "\n" << kUsage;
    return kExitUsage;
  }
  if (vm.count("help")) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (vm.count("version")) {
    std::cout << "idemgate " << idemgate::kVersion << "\n";
    return kExitOk;
  }

  const auto command = vm.count("command") ? vm["command"].as<std::vector<std::string>>()
                                           : std::vector<std::string>{};
  if (vm.count("stores") && (command.empty() || command[0] != "check-config")) {
    std::cerr << "idemgate: --stores applies to check-config only\n" << kUsage;
    return kExitUsage;
  }
  if (vm.count("partitions") && (command.empty() || command[0] != "migrate")) {
    std::cerr << "idemgate: --partitions applies to migrate only\n" << kUsage;
    return kExitUsage;
  }
  try {
    if (!command.empty() && command[0] == "check-config") {
      if (command.size() != 2) {
        std::cerr << "idemgate: check-config takes one FILE\n" << kUsage;
        return kExitUsage;
      }
      const auto config = idemgate::config::load_config(command[1]);
      for (const auto& warning : config->warnings) std::cerr << warning << "\n";
      std::cout << command[1] << ": ok\n";
      if (!vm.count("stores")) return kExitOk;
      // libpq and the store clients log through the logger (C32): JSON lines on stderr.
      idemgate::setup_logging();
      return idemgate::admin::check_stores(*config, std::cout) == 0 ? kExitOk : kExitRuntime;
    }
    if (!vm.count("config")) {
      std::cerr << "idemgate: --config FILE is required\n" << kUsage;
      return kExitUsage;
    }
    const std::string path = vm["config"].as<std::string>();
    if (!command.empty() && command[0] == "migrate") {
      if (command.size() != 1) {
        std::cerr << "idemgate: migrate takes no arguments besides --config and --partitions\n"
                  << kUsage;
        return kExitUsage;
      }
      const int partitions = vm.count("partitions") ? vm["partitions"].as<int>() : 0;
      if (vm.count("partitions") && (partitions < idemgate::storage::pg::kMinRecordPartitions ||
                                     partitions > idemgate::storage::pg::kMaxRecordPartitions)) {
        std::cerr << "idemgate: --partitions takes N from "
                  << idemgate::storage::pg::kMinRecordPartitions << " to "
                  << idemgate::storage::pg::kMaxRecordPartitions << ", not " << partitions << "\n";
        return kExitUsage;
      }
      const auto config = idemgate::config::load_config(path);
      idemgate::setup_logging();
      if (partitions > 0) return idemgate::run_partition_migration(config, partitions);
      return idemgate::run_migrations(config) ? kExitOk : kExitRuntime;
    }
    if (!command.empty() && command[0] == "keys") {
      if (command.size() < 3 || (command[1] != "show" && command[1] != "purge") ||
          !vm.count("route")) {
        std::cerr << "idemgate: keys takes show|purge, --route NAME and the KEY\n" << kUsage;
        return kExitUsage;
      }
      const auto config = idemgate::config::load_config(path);
      // The store clients log through the logger (C32): JSON lines on stderr, never on stdout.
      idemgate::setup_logging();
      idemgate::admin::KeysRequest request;
      request.action = command[1] == "show" ? idemgate::admin::KeysRequest::Action::show
                                            : idemgate::admin::KeysRequest::Action::purge;
      request.route = vm["route"].as<std::string>();
      if (vm.count("scope-header")) {
        request.scope_headers = vm["scope-header"].as<std::vector<std::string>>();
      }
      request.key.assign(command.begin() + 2, command.end());
      return idemgate::admin::run_keys(*config, request, std::cout, std::cerr);
    }
    if (!command.empty()) {
      std::cerr << "idemgate: unknown command '" << command[0] << "'\n" << kUsage;
      return kExitUsage;
    }
    return idemgate::run_gateway(path, !vm.count("no-migrate"));
  } catch (const idemgate::config::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "idemgate: " << e.what() << "\n";
    return kExitRuntime;
  }
}
