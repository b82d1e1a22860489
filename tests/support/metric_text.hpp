#pragma once
// Reading samples out of the Prometheus text exposition format, for metrics tests.

#include <map>
#include <optional>
#include <string>

namespace idemgate::test {

/// The value of the sample `name{labels}` in Prometheus text: the first line whose metric name is
/// `name` and whose label set contains every pair of `labels` (other labels may be present; pass
/// all of them to pick one series). nullopt when no such line exists.
std::optional<double> metric_value(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels = {});

}  // namespace idemgate::test
