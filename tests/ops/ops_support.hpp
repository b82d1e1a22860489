#pragma once
// Helpers for the operations suites (SPEC §1 signals, §5): an idemgate process whose config file
// the test rewrites and signals, the admin endpoints, Prometheus text lookups, test PKI made with
// the `openssl` CLI, an HTTPS client and a TLS upstream, and private stores.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/local_stores.hpp"
#include "tests/support/metric_text.hpp"
#include "tests/support/scraping.hpp"

namespace idemgate::test::ops {

using e2e::file_tail;
using e2e::kEventDeadline;
using e2e::kLoopback;
using e2e::logged_port;
using e2e::TempDir;
using e2e::wait_for_listening;

/// One `idemgate --config F` process for tests that change F or signal the process. The file
/// lives in a temporary directory; stderr goes to a file next to it.
class OpsGateway {
 public:
  /// Writes `yaml` and starts the gateway; returns once it logged both `listening` (the client
  /// port) and `admin listening` (the admin port). Throws std::runtime_error with the stderr
  /// tail when it exits first or kEventDeadline passes.
  explicit OpsGateway(const std::string& yaml);
  ~OpsGateway();
  OpsGateway(const OpsGateway&) = delete;
  OpsGateway& operator=(const OpsGateway&) = delete;

  std::uint16_t port() const { return port_; }
  std::uint16_t admin_port() const { return admin_port_; }
  const std::string& config_path() const { return config_path_; }
  const std::filesystem::path& dir() const { return dir_.path(); }

  /// Replaces the config file's content (not applied before a SIGHUP).
  void write_config(const std::string& yaml) const;
  /// Sends `signo` to the process.
  void signal(int signo);
  /// Waits until the log holds at least `count` JSON lines whose `msg` is `msg`; false after
  /// kEventDeadline or when the process exits without them.
  bool wait_for_log(const std::string& msg, std::size_t count = 1);
  /// JSON lines of the log whose `msg` is `msg`.
  std::size_t log_count(const std::string& msg) const;
  /// Waits up to kEventDeadline for the process to exit; its status, or nullopt.
  std::optional<int> wait_exit();
  bool running() { return child_->running(); }
  std::string stderr_tail() const { return file_tail(stderr_path_); }

  /// Sends `request` to the client port on a fresh connection.
  HttpResponse send(const HttpRequest& request) const;
  /// GET `path` on the admin port.
  HttpResponse admin_get(const std::string& path) const;

 private:
  TempDir dir_;
  std::string config_path_;
  std::string stderr_path_;
  std::unique_ptr<ChildProcess> child_;
  std::uint16_t port_ = 0;
  std::uint16_t admin_port_ = 0;
};

// ---------------------------------------------------------------------------------------------

/// Certificates made at test time with the `openssl` CLI (EC P-256) in a temporary directory: a
/// CA and a server certificate it signed for `localhost` and `127.0.0.1`, plus a second,
/// unrelated CA that signed nothing here. Throws std::runtime_error with openssl's output when a
/// command fails.
class TestPki {
 public:
  TestPki();
  std::string ca_file() const { return (dir_.path() / "ca.pem").string(); }
  std::string other_ca_file() const { return (dir_.path() / "other-ca.pem").string(); }
  std::string server_cert() const { return (dir_.path() / "server.pem").string(); }
  std::string server_key() const { return (dir_.path() / "server.key").string(); }

 private:
  void run(const std::string& command) const;
  TempDir dir_;
};

/// Sends `request` over HTTPS to 127.0.0.1:`port` on a fresh connection, verifying the server
/// certificate against `ca_file` and the name `127.0.0.1`. Throws boost::system::system_error on
/// a handshake or I/O failure.
HttpResponse https_request(std::uint16_t port, const std::string& ca_file,
                           const HttpRequest& request);

/// An HTTPS upstream on 127.0.0.1 (OS-chosen port), one thread: every request is answered 200
/// with `{"tls":true,"path":"<target>"}` over keep-alive. Counts the requests it read.
class TlsUpstream {
 public:
  TlsUpstream(const std::string& cert_file, const std::string& key_file);
  ~TlsUpstream();
  TlsUpstream(const TlsUpstream&) = delete;
  TlsUpstream& operator=(const TlsUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  std::string address() const { return kLoopback + ":" + std::to_string(port_); }
  /// Requests answered so far. Thread-safe.
  std::size_t requests() const;
  /// TLS handshakes that failed (e.g. the client rejected the certificate). Thread-safe.
  std::size_t failed_handshakes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
};

}  // namespace idemgate::test::ops
