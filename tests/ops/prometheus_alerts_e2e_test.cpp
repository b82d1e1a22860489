// The alerting rules and the dashboard against the real thing (SPEC C25, C31): a real Prometheus
// (tests/ops/prometheus_server.hpp) scrapes a real gateway every second while keyed requests run;
// Postgres (stores of this test alone, scripts/local-stores) is stopped, so the store-unavailable
// alert goes pending then firing, and started again, so the alert clears.
//
// Prometheus evaluates conf/prometheus/alerts.yaml with every `for:` shortened to 2s and every
// range selector to [10s] (short_rules()): the same expressions and thresholds on a time scale
// a test can wait for (minutes otherwise). Then every metric name the rules and the dashboard
// (conf/grafana/idemgate.json) mention must be in the gateway's /metrics, every rule must
// evaluate without error, and every dashboard expression must return data.
//
// ctest runs it through tests/prometheus/if-prometheus: skipped where the prometheus package is
// not installed.
#define BOOST_TEST_MODULE prometheus_alerts_e2e

#include <atomic>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <exception>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/ops/ops_support.hpp"
#include "tests/ops/prometheus_server.hpp"

namespace idemgate::test::ops {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kStoreAlert = "IdemgateStoreUnavailable";
constexpr auto kPoll = 100ms;
// The time scale of short_rules(): the rules' `for:` and range selectors.
constexpr const char* kShortFor = "2s";
constexpr const char* kShortRange = "10s";
// What the dashboard's range variable becomes in the queries here (three times the range of the
// rules, so each query sees several scrapes).
constexpr const char* kRateInterval = "30s";

std::string source_file(const std::string& relative) {
  const std::string path = require_env("IDEMGATE_SOURCE_DIR") + "/" + relative;
  std::string text = read_text_file(path);
  if (text.empty()) throw std::runtime_error("cannot read " + path);
  return text;
}

// The rule file with every `for:` and range selector shortened; the count of `for:` replaced.
std::pair<std::string, std::size_t> short_rules(const std::string& text) {
  const std::regex for_clause(R"(\bfor: *[0-9]+[smhdwy]\b)");
  const std::size_t fors = static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), for_clause), {}));
  std::string out = std::regex_replace(text, for_clause, std::string("for: ") + kShortFor);
  out = std::regex_replace(out, std::regex(R"(\[[0-9]+[smhdwy]\])"),
                           std::string("[") + kShortRange + "]");
  return {out, fors};
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Every metric name a scrape holds: sample names and the families of `# TYPE` lines (so a
// histogram's base name counts as well as its _bucket, _sum and _count).
std::set<std::string> exported_names(const std::string& text) {
  std::set<std::string> names;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name;
      words >> name;
      names.insert(name);
    } else if (!line.empty() && line[0] != '#') {
      names.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
  return names;
}

// Every dashboard expression and template variable selector, with Grafana's variables filled in
// as a query over every job and instance would have them; each with where it comes from.
std::vector<std::pair<std::string, std::string>> dashboard_queries(const std::string& text) {
  const json::object dashboard = json::parse(text).as_object();
  const auto fill = [](std::string expr) {
    expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), kRateInterval);
    return std::regex_replace(expr, std::regex(R"(\$\{?(job|instance)\}?)"), ".*");
  };
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& var : dashboard.at("templating").as_object().at("list").as_array()) {
    const auto* query = var.as_object().if_contains("query");
    if (!query || !query->is_object()) continue;  // the data source variable
    static const std::regex label_values(R"(^\s*label_values\((.*),\s*\w+\)\s*$)");
    std::smatch m;
    const std::string q(query->as_object().at("query").as_string());
    if (std::regex_match(q, m, label_values)) {
      out.emplace_back("variable " + std::string(var.as_object().at("name").as_string()),
                       fill(m[1]));
    }
  }
  for (const auto& panel : dashboard.at("panels").as_array()) {
    const auto& p = panel.as_object();
    for (const auto& target : p.at("targets").as_array()) {
      const auto& t = target.as_object();
      out.emplace_back("panel \"" + std::string(p.at("title").as_string()) + "\" target " +
                           std::string(t.at("refId").as_string()),
                       fill(std::string(t.at("expr").as_string())));
    }
  }
  return out;
}

// Keyed POSTs on one thread until destroyed: a new key each time, and every fourth request a
// retry of the previous key (so replays exist), one every 50 ms.
class Traffic {
 public:
  explicit Traffic(const OpsGateway& gateway) : thread_([this, &gateway] { run(gateway); }) {}
  ~Traffic() {
    stop_ = true;
    thread_.join();
  }
  Traffic(const Traffic&) = delete;
  Traffic& operator=(const Traffic&) = delete;

  std::uint64_t sent() const { return sent_; }
  std::uint64_t answered(unsigned status) const {
    return status == 503 ? unavailable_.load() : status == 201 ? created_.load() : 0;
  }

 private:
  void run(const OpsGateway& gateway) {
    std::string key;
    for (std::uint64_t n = 0; !stop_; ++n) {
      if (n % 4 != 3) key = e2e::unique_name("alert");
      try {
        const auto res = gateway.send(e2e::keyed_post("/pay", key, R"({"amount":1})"));
        if (res.status == 503) ++unavailable_;
        if (res.status == 201) ++created_;
      } catch (const std::exception&) {
        // counted as sent only; the assertions read Prometheus, not these figures
      }
      ++sent_;
      std::this_thread::sleep_for(50ms);
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> created_{0};
  std::atomic<std::uint64_t> unavailable_{0};
  std::thread thread_;
};

// Everything the cases share, set up once: stores, upstream, gateway, Prometheus, traffic.
struct Scenario {
  Scenario()
      : gateway(gateway_yaml()),
        rules(short_rules(source_file("conf/prometheus/alerts.yaml"))),
        prometheus({gateway.admin_port()}, rules.first),
        traffic(gateway) {
    current = this;
  }
  ~Scenario() { current = nullptr; }

  std::string gateway_yaml() {
    e2e::GatewayConfig config;
    config.upstreams = {e2e::UpstreamConfig{"up", {upstream.address()}}};
    e2e::RouteConfig route;
    route.name = "pay";
    route.path_prefix = "/";
    route.upstream = "up";
    route.mode = "required";
    // A request caught by the stop waits commit_timeout for its record: keep that short.
    route.extra = {"commit_timeout: 1s"};
    config.routes = {route};
    config.cleanup = "{ interval: 1s, batch: 100 }";
    return config.render();
  }

  std::string metrics_text() const {
    const auto res = gateway.admin_get("/metrics");
    if (res.status != 200) throw std::runtime_error("/metrics: " + e2e::describe(res));
    return res.body;
  }

  std::string diagnostics() const {
    return prometheus.diagnostics() + "\n--- idemgate stderr (tail) ---\n" + gateway.stderr_tail();
  }

  LocalStores stores;  // exports the fixture's variables: constructed before the gateway
  e2e::TestUpstream upstream;
  OpsGateway gateway;
  std::pair<std::string, std::size_t> rules;
  PrometheusServer prometheus;
  Traffic traffic;

  static Scenario* current;
};
Scenario* Scenario::current = nullptr;

BOOST_TEST_GLOBAL_FIXTURE(Scenario);

Scenario& scenario() {
  BOOST_TEST_REQUIRE(Scenario::current != nullptr);
  return *Scenario::current;
}

// Logs Prometheus's and the gateway's stderr tails when the current test case has failed.
struct DiagnosticsOnFailure {
  const Scenario& scenario;
  ~DiagnosticsOnFailure() {
    namespace ut = boost::unit_test;
    const auto id = ut::framework::current_test_case_id();
    if (std::uncaught_exceptions() > 0 || ut::results_collector.results(id).p_assertions_failed > 0)
      BOOST_TEST_MESSAGE(scenario.diagnostics());
  }
};

// Polls `done` every kPoll until it returns true (true) or kEventDeadline passes (false).
template <class Done>
bool wait_until(Done done) {
  const auto deadline = Clock::now() + e2e::kEventDeadline;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

std::string state_of(const std::map<std::string, std::string>& alerts, const std::string& name) {
  const auto it = alerts.find(name);
  return it == alerts.end() ? "inactive" : it->second;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C25_store_unavailable_alert_fires_while_postgres_is_down_and_clears) {
  auto& s = scenario();
  auto& prometheus = s.prometheus;
  const DiagnosticsOnFailure diagnostics{s};
  // Every rule of the file was shortened and loaded.
  BOOST_TEST(s.rules.second == 9u);
  BOOST_TEST(prometheus.rules().size() == s.rules.second);

  // Served keyed requests reach Prometheus; nothing fails on the stores yet.
  BOOST_TEST_REQUIRE(wait_until([&] {
    return !prometheus.query(R"(sum(rate(idemgate_requests_total{outcome="executed"}[10s])) > 0)")
                .empty();
  }));
  BOOST_TEST(state_of(prometheus.alerts(), kStoreAlert) == "inactive");

  s.stores.stop_pg();
  const auto stopped = Clock::now();
  const double stopped_unix = unix_now();
  double pending_s = -1;
  double firing_s = -1;
  const bool fired = wait_until([&] {
    const auto state = state_of(prometheus.alerts(), kStoreAlert);
    if (state == "pending" && pending_s < 0) pending_s = seconds_since(stopped);
    if (state == "firing") firing_s = seconds_since(stopped);
    return state == "firing";
  });
  BOOST_TEST(fired);
  BOOST_TEST(pending_s >= 0, "the alert was never seen pending before it fired");
  const auto down = prometheus.query("idemgate_ready");
  BOOST_TEST_REQUIRE(down.size() == 1u);
  BOOST_TEST(down[0].as_object().at("value").as_array()[1].as_string() == "0");

  // The cleaner (every 1 s) cannot reach Postgres: its last run stays before the stop.
  const double last_run_down =
      metric_value(s.metrics_text(), "idemgate_cleaner_last_run_timestamp_seconds").value_or(-1);
  BOOST_TEST(last_run_down > 0);
  BOOST_TEST(last_run_down <= stopped_unix);
  BOOST_TEST(s.gateway.log_count("cleanup failed; retrying next interval") >= 1u);

  const auto unavailable = s.traffic.answered(503);
  s.stores.start_pg();
  const auto started = Clock::now();
  const double started_unix = unix_now();
  double cleared_s = -1;
  const bool cleared = wait_until([&] {
    const bool active = state_of(prometheus.alerts(), kStoreAlert) != "inactive";
    if (!active) cleared_s = seconds_since(started);
    return !active;
  });
  BOOST_TEST(cleared);
  BOOST_TEST(wait_until([&] {
    return metric_value(s.metrics_text(), "idemgate_cleaner_last_run_timestamp_seconds")
               .value_or(0) > started_unix;
  }));
  BOOST_TEST_MESSAGE("figures scenario=store_unavailable_alert pending_s="
                     << pending_s << " firing_s=" << firing_s
                     << " cleared_after_restart_s=" << cleared_s << " requests=" << s.traffic.sent()
                     << " answered_503=" << unavailable
                     << " answered_201=" << s.traffic.answered(201) << " for=" << kShortFor
                     << " range=" << kShortRange);
}

BOOST_AUTO_TEST_CASE(
    spec_C31_rules_and_dashboard_use_exported_metrics_and_every_panel_has_data,
    *boost::unit_test::depends_on(
        "spec_C25_store_unavailable_alert_fires_while_postgres_is_down_and_clears")) {
  auto& s = scenario();
  const DiagnosticsOnFailure diagnostics{s};
  const std::string rules_text = source_file("conf/prometheus/alerts.yaml");
  const std::string dashboard_text = source_file("conf/grafana/idemgate.json");

  // After the outage every family has a series (store errors included).
  const auto exported = exported_names(s.metrics_text());
  const std::regex metric_name(R"(\bidemgate_[a-z0-9_]+)");
  std::size_t mentioned = 0;
  for (const auto* text : {&rules_text, &dashboard_text}) {
    for (std::sregex_iterator it(text->begin(), text->end(), metric_name), end; it != end; ++it) {
      ++mentioned;
      BOOST_TEST(exported.count(it->str()) == 1u, it->str() << " is not in the gateway's /metrics");
    }
  }
  BOOST_TEST(mentioned > 0u);

  for (const auto& rule : s.prometheus.rules()) {
    BOOST_TEST(rule.at("health").as_string() == "ok", rule.at("name").as_string()
                                                          << ": " << json::serialize(rule));
  }

  const auto queries = dashboard_queries(dashboard_text);
  BOOST_TEST(queries.size() > 10u);
  for (const auto& [where, expr] : queries) {
    json::array result;
    BOOST_CHECK_NO_THROW(result = s.prometheus.query(expr));
    BOOST_TEST(!result.empty(), where << " returned no series: " << expr);
  }
  BOOST_TEST_MESSAGE("figures scenario=dashboard_queries queries="
                     << queries.size() << " metric_mentions=" << mentioned);
}

}  // namespace idemgate::test::ops
