#include "tests/support/scraping.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <functional>
#include <sstream>
#include <string_view>

#include "tests/support/metric_text.hpp"

namespace idemgate::test {
namespace {

namespace json = boost::json;

std::vector<json::object> lines_where(const std::string& text,
                                      const std::function<bool(std::string_view msg)>& keep) {
  std::vector<json::object> out;
  for (auto& line : log_lines(text)) {
    const auto* msg = line.if_contains("msg");
    if (msg && msg->is_string() && keep(msg->as_string())) out.push_back(std::move(line));
  }
  return out;
}

}  // namespace

std::optional<double> metric(const e2e::Gateway& gateway, int instance, const std::string& name,
                             const std::map<std::string, std::string>& labels) {
  return metric_value(gateway.admin_get("/metrics", instance).body, name, labels);
}

double metric_sum(const e2e::Gateway& gateway, const std::string& name,
                  const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (int i = 0; i < gateway.instances(); ++i) sum += metric(gateway, i, name, labels).value_or(0);
  return sum;
}

std::optional<double> failovers(const e2e::Gateway& gateway, int instance,
                                const std::string& store) {
  return metric(gateway, instance, "idemgate_store_failovers_total", {{"store", store}});
}

std::uint64_t duplicates(const e2e::Gateway& gateway) {
  return static_cast<std::uint64_t>(metric_sum(gateway, "idemgate_duplicate_executions_total"));
}

void check_no_failover(const e2e::Gateway& gateway, const std::string& store) {
  for (int i = 0; i < gateway.instances(); ++i) {
    BOOST_TEST_CONTEXT("instance " << i << " before the failover") {
      BOOST_TEST(failovers(gateway, i, store).value_or(-1) == 0,
                 "idemgate_store_failovers_total{store=\"" << store << "\"} is not exported as 0");
      BOOST_TEST(log_lines(gateway.stderr_text(i), "store failover").empty());
    }
  }
}

void check_one_failover(const e2e::Gateway& gateway, const std::string& store,
                        const std::string& from, const std::string& to) {
  for (int i = 0; i < gateway.instances(); ++i) {
    BOOST_TEST_CONTEXT("instance " << i << " after the failover") {
      BOOST_TEST(failovers(gateway, i, store).value_or(-1) == 1, gateway.diagnostics());
      const auto lines = log_lines(gateway.stderr_text(i), "store failover");
      BOOST_TEST(lines.size() == 1u, gateway.diagnostics());
      for (const auto& line : lines) {
        BOOST_TEST(field(line, "store") == store, json::serialize(line));
        BOOST_TEST(field(line, "from") == from, json::serialize(line));
        BOOST_TEST(field(line, "to") == to, json::serialize(line));
      }
    }
  }
}

std::vector<json::object> log_lines(const std::string& text) {
  std::vector<json::object> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    json::error_code ec;
    json::value v = json::parse(line, ec);
    if (!ec && v.is_object()) out.push_back(std::move(v.as_object()));
  }
  return out;
}

std::vector<json::object> log_lines(const std::string& text, const std::string& msg) {
  return lines_where(text, [&](std::string_view m) { return m == msg; });
}

std::vector<json::object> log_lines_containing(const std::string& text,
                                               const std::string& fragment) {
  return lines_where(text, [&](std::string_view m) { return m.find(fragment) != m.npos; });
}

std::string field(const json::object& line, const char* name) {
  const auto* v = line.if_contains(name);
  return v && v->is_string() ? std::string(v->as_string()) : "";
}

}  // namespace idemgate::test
