// C57 with a real browser: headless Chromium (Debian's `chromium`) loads a page from one loopback
// origin that POSTs to the gateway on another port with Idempotency-Key, twice, and reads
// Idempotent-Replayed. The page works only when the gateway answers the preflight and exposes
// the field; the result is written into the page and read back with --dump-dom.
#define BOOST_TEST_MODULE browser_cors_e2e
#include <boost/test/unit_test.hpp>

#include "tests/contract/contract_support.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;

/// The page: two identical keyed POSTs, then what the browser let the script see.
std::string page(std::uint16_t gateway_port) {
  const std::string url = "http://127.0.0.1:" + std::to_string(gateway_port) + "/api/orders";
  return R"(<!doctype html><html><body><pre id="out">pending</pre><script>
(async () => {
  const key = crypto.randomUUID();
  const post = () => fetch(")" +
         url + R"(", {method: "POST", body: "{\"amount\":1}",
      headers: {"Content-Type": "application/json", "Idempotency-Key": key}});
  const first = await post();
  const second = await post();
  const a = await first.text();
  const b = await second.text();
  document.getElementById("out").textContent = "result " + JSON.stringify({
    first: first.status, first_replayed: first.headers.get("Idempotent-Replayed"),
    second: second.status, second_replayed: second.headers.get("Idempotent-Replayed"),
    same_body: a === b});
})().catch(e => { document.getElementById("out").textContent = "result error " + e; });
</script></body></html>)";
}

/// Runs headless Chromium on `url` and returns the DOM it dumps (stdout).
std::string dump_dom(const std::string& url) {
  TempDir profile;
  ChildOptions o;
  o.executable = "/usr/bin/chromium";
  // --virtual-time-budget: the DOM is dumped once the page is idle, its fetches answered.
  o.args = {"--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--user-data-dir=" + (profile.path() / "profile").string(),
            "--virtual-time-budget=20000",
            "--dump-dom",
            url};
  o.stdout_path = (profile.path() / "dom.html").string();
  o.stderr_path = (profile.path() / "chromium.log").string();
  ChildProcess chromium(o);
  const auto status = chromium.wait_for(std::chrono::seconds(120));
  const std::string dom = read_text_file(o.stdout_path);
  BOOST_TEST_REQUIRE(status.has_value(), "chromium did not finish; its log:\n"
                                             << file_tail(o.stderr_path));
  BOOST_TEST(*status == 0, file_tail(o.stderr_path));
  return dom;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C57_a_browser_page_on_another_origin_sends_the_key_and_reads_replays) {
  TestUpstream site;  // serves the page: the browser's origin
  TestUpstream api;   // the API behind the gateway, which knows nothing of CORS
  const std::string origin = "http://127.0.0.1:" + std::to_string(site.port());

  GatewayConfig config;
  config.upstreams = {{"api", {api.address()}}};
  const std::string name = unique_route("c57_browser");
  config.routes_yaml = "  - name: " + name +
                       "\n"
                       "    match: { path_prefix: /api/ }\n"
                       "    upstream: api\n"
                       "    idempotency: { mode: required, methods: [POST] }\n"
                       "    cors: { allow_origins: [\"" +
                       origin + "\"], allow_headers: [Content-Type] }\n";
  Gateway gateway(config);
  UpstreamReply html;
  html.status = 200;
  html.headers = {{"Content-Type", "text/html; charset=utf-8"}};
  html.body = page(gateway.port());
  site.on("/", {html});

  const std::string dom = dump_dom(origin + "/");
  BOOST_TEST(dom.find(R"("first":201)") != std::string::npos, dom << gateway.diagnostics());
  BOOST_TEST(dom.find(R"("first_replayed":null)") != std::string::npos, dom);
  BOOST_TEST(dom.find(R"("second":201)") != std::string::npos, dom);
  BOOST_TEST(dom.find(R"("second_replayed":"true")") != std::string::npos, dom);
  BOOST_TEST(dom.find(R"("same_body":true)") != std::string::npos, dom);
  // One execution; the preflights never reached the API.
  BOOST_TEST(api.count("/api/orders") == 1u);
  for (const auto& r : api.received("/api/orders")) BOOST_TEST(r.method == "POST");
}
