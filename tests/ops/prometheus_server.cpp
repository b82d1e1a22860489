#include "tests/ops/prometheus_server.hpp"

#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace idemgate::test::ops {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

// Prometheus announces readiness only through /-/ready: poll it.
constexpr auto kPollInterval = 50ms;

std::string find_prometheus() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(std::string(path ? path : "") + ":/usr/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const auto candidate = std::filesystem::path(dir) / "prometheus";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error("prometheus is not on PATH (install the prometheus package)");
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

std::string url_encode(const std::string& text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

PrometheusServer::PrometheusServer(const std::vector<std::uint16_t>& targets,
                                   const std::string& rules_yaml)
    : stderr_path_((dir_.path() / "prometheus.log").string()), port_(free_port()) {
  write_file(dir_.path() / "rules.yaml", rules_yaml);
  std::ostringstream config;
  config << "global:\n"
         << "  scrape_interval: 1s\n"
         << "  scrape_timeout: 1s\n"
         << "  evaluation_interval: 1s\n"
         << "rule_files:\n"
         << "  - rules.yaml\n"
         << "scrape_configs:\n"
         << "  - job_name: idemgate\n"
         << "    static_configs:\n"
         << "      - targets:\n";
  for (const auto port : targets) config << "          - " << e2e::kLoopback << ":" << port << "\n";
  const auto config_path = dir_.path() / "prometheus.yml";
  write_file(config_path, config.str());

  ChildOptions o;
  o.executable = find_prometheus();
  o.args = {"--config.file=" + config_path.string(),
            "--storage.tsdb.path=" + (dir_.path() / "tsdb").string(),
            "--web.listen-address=" + e2e::kLoopback + ":" + std::to_string(port_)};
  o.stderr_path = stderr_path_;
  o.stdout_path = (dir_.path() / "prometheus.out").string();
  child_ = std::make_unique<ChildProcess>(o);

  const auto deadline = std::chrono::steady_clock::now() + e2e::kEventDeadline;
  for (;;) {
    try {
      if (http_request(e2e::kLoopback, port_, {"GET", "/-/ready", {}, ""}, 2s).status == 200)
        return;
    } catch (const std::exception&) {
      // not listening yet
    }
    if (std::chrono::steady_clock::now() > deadline || !child_->running())
      throw std::runtime_error("prometheus did not become ready\n" + diagnostics());
    std::this_thread::sleep_for(kPollInterval);
  }
}

PrometheusServer::~PrometheusServer() {
  child_->stop();
}

json::value PrometheusServer::get(const std::string& target) const {
  const auto res = http_request(e2e::kLoopback, port_, {"GET", target, {}, ""}, 10s);
  json::error_code ec;
  json::value body = json::parse(res.body, ec);
  const auto* status = !ec && body.is_object() ? body.as_object().if_contains("status") : nullptr;
  if (!status || !status->is_string() || status->as_string() != "success" ||
      !body.as_object().contains("data")) {
    throw std::runtime_error("prometheus GET " + target + " answered " +
                             std::to_string(res.status) + ": " + res.body);
  }
  return body.as_object().at("data");
}

json::array PrometheusServer::query(const std::string& promql) const {
  return get("/api/v1/query?query=" + url_encode(promql)).as_object().at("result").as_array();
}

std::map<std::string, std::string> PrometheusServer::alerts() const {
  std::map<std::string, std::string> out;
  const json::value data = get("/api/v1/alerts");
  for (const auto& alert : data.as_object().at("alerts").as_array()) {
    const auto& a = alert.as_object();
    const std::string name(a.at("labels").as_object().at("alertname").as_string());
    const std::string state(a.at("state").as_string());
    auto& slot = out[name];
    if (slot != "firing") slot = state;
  }
  return out;
}

std::vector<json::object> PrometheusServer::rules() const {
  std::vector<json::object> out;
  const json::value data = get("/api/v1/rules");
  for (const auto& group : data.as_object().at("groups").as_array()) {
    for (const auto& rule : group.as_object().at("rules").as_array()) {
      out.push_back(rule.as_object());
    }
  }
  return out;
}

std::string PrometheusServer::diagnostics() const {
  return "--- prometheus stderr (tail) ---\n" + e2e::file_tail(stderr_path_);
}

}  // namespace idemgate::test::ops
