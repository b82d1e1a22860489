#pragma once
// What running gateways tell about themselves: samples of their /metrics (SPEC C31) and the JSON
// lines of their logs (C32), for the scale and fault suites.

#include <boost/json/object.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"

namespace idemgate::test {

/// The sample `name{labels}` on /metrics of `instance` (metric_value); nullopt when it is not
/// exported.
std::optional<double> metric(const e2e::Gateway& gateway, int instance, const std::string& name,
                             const std::map<std::string, std::string>& labels = {});

/// metric() summed over every instance of `gateway`, a missing sample counting 0.
double metric_sum(const e2e::Gateway& gateway, const std::string& name,
                  const std::map<std::string, std::string>& labels = {});

/// `idemgate_store_failovers_total{store}` of `instance` (C46); `store` is postgres or redis.
std::optional<double> failovers(const e2e::Gateway& gateway, int instance,
                                const std::string& store);

/// `idemgate_duplicate_executions_total` summed over the instances (C36).
std::uint64_t duplicates(const e2e::Gateway& gateway);

/// SPEC C46 before any switch: on every instance of `gateway`,
/// `idemgate_store_failovers_total{store}` is exported as 0 and no `store failover` line was
/// logged.
void check_no_failover(const e2e::Gateway& gateway, const std::string& store);

/// SPEC C46 after one switch of `store` from `from` to `to` (`host:port`): on every instance the
/// counter is 1 and one `store failover` line names the store and both addresses.
void check_one_failover(const e2e::Gateway& gateway, const std::string& store,
                        const std::string& from, const std::string& to);

/// The JSON objects among the lines of `text` (a gateway's stderr), in order.
std::vector<boost::json::object> log_lines(const std::string& text);

/// The log lines of `text` whose `msg` is `msg`.
std::vector<boost::json::object> log_lines(const std::string& text, const std::string& msg);

/// The log lines of `text` whose `msg` contains `fragment`.
std::vector<boost::json::object> log_lines_containing(const std::string& text,
                                                      const std::string& fragment);

/// The string member `name` of a log line; "" when it is absent or not a string.
std::string field(const boost::json::object& line, const char* name);

}  // namespace idemgate::test
