#pragma once
// A real Prometheus (Debian's `prometheus` package) for testing the alerting rules and the
// dashboard against a real gateway: it scrapes gateways' admin /metrics on loopback and evaluates
// a rule file, and the test reads its HTTP API.

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/support/process.hpp"

namespace idemgate::test::ops {

/// `prometheus` as a child process with its configuration, rule file and TSDB in a temporary
/// directory, listening on a free port of 127.0.0.1 only. It scrapes `/metrics` of every
/// 127.0.0.1 port in `targets` (job `idemgate`) and evaluates `rules_yaml` (a Prometheus rule
/// file's text), both every second (scrape_timeout 1 s).
///
/// The constructor returns once `/-/ready` answers 200; it throws std::runtime_error with
/// Prometheus's stderr when that does not happen within e2e::kEventDeadline or the binary is
/// missing (`prometheus` on PATH). The destructor stops the process by PID and removes the
/// directory. Every API call throws std::runtime_error when the answer is not
/// `{"status":"success",…}`.
///
/// @par Thread Safety
/// Use from the thread that created the object (the process is its child, see ChildProcess).
class PrometheusServer {
 public:
  PrometheusServer(const std::vector<std::uint16_t>& targets, const std::string& rules_yaml);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  std::uint16_t port() const { return port_; }

  /// GET /api/v1/query?query=`promql` (an instant query, now): `data.result`, one object per
  /// series (`metric`, `value`: [time, "text"]).
  boost::json::array query(const std::string& promql) const;
  /// GET /api/v1/alerts: each active alert's name and state (`pending` or `firing`); when several
  /// series of one alert are active, `firing` wins.
  std::map<std::string, std::string> alerts() const;
  /// GET /api/v1/rules: every rule of every group (`name`, `query`, `health`, `lastError`…).
  std::vector<boost::json::object> rules() const;

  /// Prometheus's stderr tail, labelled, for failure messages.
  std::string diagnostics() const;

 private:
  /// GET `target` on the API; the `data` member of a successful answer.
  boost::json::value get(const std::string& target) const;

  e2e::TempDir dir_;
  std::string stderr_path_;
  std::uint16_t port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

/// `text` with every character outside RFC 3986's unreserved set percent-encoded, for a query
/// parameter's value.
std::string url_encode(const std::string& text);

}  // namespace idemgate::test::ops
