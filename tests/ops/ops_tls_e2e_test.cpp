// TLS on both sides of the gateway, with certificates made at test time by the `openssl` CLI:
// an HTTPS client through `listen.tls`, and upstreams with `tls: true` verified against a CA.
#define BOOST_TEST_MODULE ops_tls_e2e
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <stdexcept>

#include "tests/ops/ops_support.hpp"

namespace idemgate::test::ops {
namespace {

using e2e::GatewayConfig;
using e2e::is_problem;
using e2e::RouteConfig;
using e2e::TestUpstream;
using e2e::UpstreamConfig;

RouteConfig route(const std::string& name, const std::string& prefix, const std::string& upstream) {
  RouteConfig r;
  r.name = name;
  r.path_prefix = prefix;
  r.upstream = upstream;
  return r;
}

// Inserts `lines` (each a `key: value` of the upstream mapping) under `upstreams.NAME`.
std::string with_upstream_keys(std::string yaml, const std::string& name,
                               const std::vector<std::string>& lines) {
  const std::string anchor = "\n  " + name + ":\n";
  const auto at = yaml.find(anchor);
  if (at == std::string::npos) throw std::runtime_error("no upstream " + name + " in\n" + yaml);
  std::string text;
  for (const auto& line : lines) text += "    " + line + "\n";
  yaml.insert(at + anchor.size(), text);
  return yaml;
}

// `yaml` with its listener made TLS with `pki`'s server certificate; `more` adds entries to the
// `tls` mapping (e.g. `, alpn: [h2]`).
std::string with_tls_listener(std::string yaml, const TestPki& pki, const std::string& more = "") {
  const std::string listen = "listen: { address: 127.0.0.1, port: 0 }";
  const auto at = yaml.find(listen);
  if (at == std::string::npos) throw std::runtime_error("no plain listener in\n" + yaml);
  yaml.replace(at, listen.size(),
               "listen: { address: 127.0.0.1, port: 0, tls: { cert: \"" + pki.server_cert() +
                   "\", key: \"" + pki.server_key() + "\"" + more + " } }");
  return yaml;
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_https_client_is_served_through_the_tls_listener) {
  TestPki pki;
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {UpstreamConfig{"up", {upstream.address()}}};
  config.routes = {route("all", "/", "up")};
  OpsGateway gateway(with_tls_listener(config.render(), pki));

  const auto res = https_request(gateway.port(), pki.ca_file(), {"GET", "/secure", {}, ""});
  BOOST_TEST(res.status == 201u, e2e::describe(res));
  const auto received = upstream.received("/secure");
  BOOST_TEST_REQUIRE(received.size() == 1u);
  BOOST_TEST(received[0].value("X-Forwarded-Proto").value_or("") == "https");

  // The port speaks TLS only: a plain HTTP request gets no HTTP answer.
  BOOST_CHECK_THROW(http_request(e2e::kLoopback, gateway.port(), {"GET", "/plain", {}, ""}),
                    std::exception);
  BOOST_TEST(upstream.count("/plain") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C49_alpn_offers_h2_then_http1_on_the_tls_listener) {
  TestPki pki;
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {UpstreamConfig{"up", {upstream.address()}}};
  config.routes = {route("all", "/", "up")};
  const auto with_tls = [&](const std::string& alpn) {
    return with_tls_listener(config.render(), pki, alpn);
  };

  // curl's %{http_version} of one GET over HTTPS, with `flag` choosing what curl offers.
  const auto version_of = [&](const OpsGateway& gateway, const std::string& flag) {
    const auto run =
        e2e::run_program("/usr/bin/curl",
                         {"-s", flag, "--cacert", pki.ca_file(), "-o", "/dev/null", "-w",
                          "%{http_version} %{http_code}",
                          "https://127.0.0.1:" + std::to_string(gateway.port()) + "/alpn"},
                         gateway.dir());
    return run.out;
  };
  {
    OpsGateway gateway(with_tls(""));  // the default: [h2, http/1.1]
    BOOST_TEST(version_of(gateway, "--http2") == "2 201");
    BOOST_TEST(version_of(gateway, "--http1.1") == "1.1 201");
    const auto received = upstream.received("/alpn");
    BOOST_TEST_REQUIRE(received.size() == 2u);
    BOOST_TEST(received[0].value("X-Forwarded-Proto").value_or("") == "https");
  }
  {
    OpsGateway gateway(with_tls(", alpn: [\"http/1.1\"]"));  // HTTP/2 not offered
    BOOST_TEST(version_of(gateway, "--http2") == "1.1 201");
  }
  BOOST_TEST(upstream.count("/alpn") == 3u);
}

BOOST_AUTO_TEST_CASE(a_tls_upstream_is_reached_when_its_certificate_verifies_and_502_otherwise) {
  TestPki pki;
  TlsUpstream secure(pki.server_cert(), pki.server_key());
  GatewayConfig config;
  config.upstreams = {UpstreamConfig{"good", {secure.address()}},
                      UpstreamConfig{"wrongca", {secure.address()}},
                      UpstreamConfig{"wrongname", {secure.address()}}};
  config.routes = {route("good", "/good", "good"), route("wrongca", "/wrongca", "wrongca"),
                   route("wrongname", "/wrongname", "wrongname")};
  std::string yaml = config.render();
  yaml = with_upstream_keys(yaml, "good", {"tls: true", "tls_ca_file: \"" + pki.ca_file() + "\""});
  yaml = with_upstream_keys(yaml, "wrongca",
                            {"tls: true", "tls_ca_file: \"" + pki.other_ca_file() + "\""});
  yaml = with_upstream_keys(
      yaml, "wrongname",
      {"tls: true", "tls_ca_file: \"" + pki.ca_file() + "\"", "tls_server_name: other.example"});
  OpsGateway gateway(yaml);

  const auto good = gateway.send({"GET", "/good/x", {}, ""});
  BOOST_TEST(good.status == 200u, e2e::describe(good));
  BOOST_TEST(good.body == R"({"tls":true,"path":"/good/x"})");
  BOOST_TEST(secure.requests() == 1u);

  const auto wrong_ca = gateway.send({"GET", "/wrongca/x", {}, ""});
  BOOST_TEST(is_problem(wrong_ca, 502));
  BOOST_TEST(wrong_ca.body.find("certificate verify failed") != std::string::npos, wrong_ca.body);

  const auto wrong_name = gateway.send({"GET", "/wrongname/x", {}, ""});
  BOOST_TEST(is_problem(wrong_name, 502));
  BOOST_TEST(secure.requests() == 1u);

  // Pooled TLS connections are reused: a second request needs no new handshake to succeed.
  const auto again = gateway.send({"GET", "/good/y", {}, ""});
  BOOST_TEST(again.status == 200u, e2e::describe(again));
  BOOST_TEST(secure.requests() == 2u);
}

BOOST_AUTO_TEST_CASE(check_config_rejects_tls_ca_file_without_tls) {
  TestUpstream upstream;
  GatewayConfig config;
  config.upstreams = {UpstreamConfig{"up", {upstream.address()}}};
  config.routes = {route("all", "/", "up")};
  TestPki pki;
  const std::string yaml =
      with_upstream_keys(config.render(), "up", {"tls_ca_file: \"" + pki.ca_file() + "\""});
  e2e::TempDir dir;
  const std::string path = (dir.path() / "bad.yaml").string();
  {
    std::ofstream out(path);
    out << yaml;
  }
  ChildOptions o;
  o.executable = require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  o.args = {"check-config", path};
  o.stdout_path = (dir.path() / "out").string();
  o.stderr_path = (dir.path() / "err").string();
  ChildProcess child(o);
  const auto status =
      child.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(e2e::kEventDeadline));
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(*status == 2);
  const std::string err = read_text_file(o.stderr_path);
  BOOST_TEST(err.find("upstreams.up.tls_ca_file: needs tls: true") != std::string::npos, err);
}

}  // namespace idemgate::test::ops
