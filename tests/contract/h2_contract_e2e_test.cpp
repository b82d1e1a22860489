// HTTP/2 to clients (SPEC C49, C50), end to end with real HTTP/2 clients: curl
// (`--http2-prior-knowledge`) and nghttp (several streams on one connection), against a real
// idemgate in front of the in-test HTTP/1.1 upstream, with the stores from the environment.
#define BOOST_TEST_MODULE h2_contract_e2e
#include <boost/test/unit_test.hpp>
#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "tests/contract/contract_support.hpp"
#include "tests/support/metric_text.hpp"

namespace {

using namespace idemgate::test;
using namespace idemgate::test::contract;

/// What an HTTP/2 client got for one request.
struct H2Answer {
  std::string version;  ///< curl's %{http_version}: "2" for HTTP/2
  unsigned status = 0;
  std::map<std::string, std::string> headers;  ///< lower-case names, last value kept
  std::string body;
  std::string err;
  /// The value of field `name` (lower case), "" when absent.
  std::string field(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

struct H2Fixture {
  TestUpstream upstream;
  std::string keyed = unique_route("h2_keyed");
  Gateway gateway{h2_gateway_config(
      upstream, keyed, "{ max_request_body: 64KiB, max_header_bytes: 4KiB, drain_timeout: 10s }")};

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(gateway.port()) + path;
  }

  /// One request by curl with HTTP/2 prior knowledge (`h2 = false`: HTTP/1.1).
  H2Answer curl(const std::string& method, const std::string& path, HeaderList fields = {},
                const std::optional<std::string>& body = std::nullopt, bool h2 = true) const {
    const std::string name = unique_name("curl");
    const auto head_path = (gateway.dir() / (name + ".head")).string();
    const auto body_path = (gateway.dir() / (name + ".body")).string();
    std::vector<std::string> args = {"-s", h2 ? "--http2-prior-knowledge" : "--http1.1",
                                     "-X", method,
                                     "-D", head_path,
                                     "-o", body_path,
                                     "-w", "%{http_version}"};
    if (method == "HEAD")
      args = {"-s",      "-I", "--http2-prior-knowledge", "-D", head_path, "-o",
              body_path, "-w", "%{http_version}"};
    for (const auto& [n, v] : fields) args.insert(args.end(), {"-H", n + ": " + v});
    std::string data_path;
    if (body) {
      data_path = (gateway.dir() / (name + ".data")).string();
      std::ofstream(data_path, std::ios::binary) << *body;
      args.insert(args.end(), {"--data-binary", "@" + data_path});
    }
    args.push_back(url(path));
    const CliResult run = run_program("/usr/bin/curl", args, gateway.dir());
    H2Answer out;
    out.version = run.out;
    out.err = run.err;
    std::istringstream head(read_text_file(head_path));
    std::string line;
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.starts_with("HTTP/")) {
        out.status = static_cast<unsigned>(std::stoul(line.substr(line.find(' ') + 1)));
        out.headers.clear();  // the final response's fields only
      } else if (const auto colon = line.find(':'); colon != std::string::npos) {
        out.headers[lower(line.substr(0, colon))] =
            line.substr(line.find_first_not_of(' ', colon + 1));
      }
    }
    out.body = read_text_file(body_path);
    return out;
  }

  /// `count` identical requests as streams of one connection (nghttp -m), all sent at once.
  /// Returns the status of every answered stream.
  std::vector<unsigned> nghttp_streams(const std::string& path, int count, HeaderList fields,
                                       const std::optional<std::string>& body) const {
    std::vector<std::string> args = {"-n", "-s", "-m", std::to_string(count)};
    for (const auto& [n, v] : fields) args.insert(args.end(), {"-H", lower(n) + ": " + v});
    if (body) {
      const auto data_path = (gateway.dir() / (unique_name("nghttp") + ".data")).string();
      std::ofstream(data_path, std::ios::binary) << *body;
      args.insert(args.end(), {"-d", data_path});
    }
    args.push_back(url(path));
    const CliResult run = run_program("/usr/bin/nghttp", args, gateway.dir());
    BOOST_TEST(run.status == 0, "nghttp: " << run.status << "\n" << run.out << run.err);
    std::vector<unsigned> statuses;
    std::istringstream lines(run.out);
    std::string line;
    // The statistics: `id responseEnd requestStart process code size path`, one per stream.
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
      if (w.size() == 7 && w[6] == path && std::all_of(w[4].begin(), w[4].end(), ::isdigit)) {
        statuses.push_back(static_cast<unsigned>(std::stoul(w[4])));
      }
    }
    return statuses;
  }
};

std::string access_lines_with(const Gateway& gateway, const std::string& needle) {
  std::istringstream lines(gateway.stderr_text());
  std::string line;
  std::string found;
  while (std::getline(lines, line)) {
    if (line.find("\"msg\":\"access\"") != std::string::npos &&
        line.find(needle) != std::string::npos)
      found += line + "\n";
  }
  return found;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(h2, H2Fixture)

BOOST_AUTO_TEST_CASE(spec_C49_h2c_prior_knowledge_and_http1_share_one_listener) {
  upstream.on("/things", {{200, {{"Content-Type", "text/plain"}}, std::string("things")}});
  const H2Answer h2 = curl("GET", "/things?x=1", {{"X-Trace", "t1"}});
  BOOST_TEST(h2.version == "2", h2.err);
  BOOST_TEST(h2.status == 200u, h2.err);
  BOOST_TEST(h2.body == "things");
  BOOST_TEST(h2.headers.count("date") == 1u);
  BOOST_TEST(h2.field("via").find("idemgate") != std::string::npos);
  BOOST_TEST(!h2.field("x-request-id").empty());
  // The upstream got HTTP/1.1 with :authority as Host and the forwarding fields (C02).
  const auto got = upstream.received("/things");
  BOOST_TEST_REQUIRE(got.size() == 1u);
  BOOST_TEST(got[0].target == "/things?x=1");
  BOOST_TEST(got[0].value("Host").value_or("") == "127.0.0.1:" + std::to_string(gateway.port()));
  BOOST_TEST(got[0].value("X-Trace").value_or("") == "t1");
  BOOST_TEST(got[0].value("X-Forwarded-Proto").value_or("") == "http");
  BOOST_TEST(got[0].value("X-Request-Id").value_or("") == h2.field("x-request-id"));
  // The access line names the protocol.
  BOOST_TEST(eventually([&] { return !access_lines_with(gateway, "\"protocol\":\"h2\"").empty(); }),
             gateway.diagnostics());

  // Operators tell the protocols apart (C49): streams and connections of HTTP/2 are counted.
  const std::string metrics = gateway.admin_get("/metrics").body;
  BOOST_TEST(metric_value(metrics, "idemgate_h2_streams_total").value_or(0) >= 1.0, metrics);
  BOOST_TEST(metric_value(metrics, "idemgate_h2_connections").has_value());

  const H2Answer h1 = curl("GET", "/things", {}, std::nullopt, false);
  BOOST_TEST(h1.version == "1.1");
  BOOST_TEST(h1.status == 200u);
  BOOST_TEST(upstream.count("/things") == 2u);

  // HEAD: the fields of a GET, no body (C03).
  const H2Answer head = curl("HEAD", "/things");
  BOOST_TEST(head.status == 200u, head.err);
  BOOST_TEST(head.field("content-length") == "6");
}

BOOST_AUTO_TEST_CASE(spec_C49_a_keyed_retry_replays_across_http1_and_h2) {
  const std::string body = R"({"amount":"1.00"})";
  const HeaderList json = {{"Content-Type", "application/json"}};
  // Made over HTTP/2, replayed over HTTP/1.1…
  HeaderList first = json;
  first.emplace_back("Idempotency-Key", "h2-then-h1");
  const H2Answer made = curl("POST", "/pay/a", first, body);
  BOOST_TEST_REQUIRE(made.status == 201u, made.err << gateway.diagnostics());
  BOOST_TEST(made.headers.count("idempotent-replayed") == 0u);
  const HttpResponse replayed = gateway.send(keyed_post("/pay/a", "h2-then-h1", body));
  BOOST_TEST(replayed.status == 201u, describe(replayed));
  BOOST_TEST(replayed.body == made.body);
  BOOST_TEST(replayed.header("Idempotent-Replayed").value_or("") == "true");
  BOOST_TEST(upstream.count("/pay/a") == 1u);
  // …and made over HTTP/1.1, replayed over HTTP/2.
  const HttpResponse made1 = gateway.send(keyed_post("/pay/b", "h1-then-h2", body));
  BOOST_TEST_REQUIRE(made1.status == 201u, describe(made1));
  HeaderList second = json;
  second.emplace_back("Idempotency-Key", "h1-then-h2");
  const H2Answer replayed2 = curl("POST", "/pay/b", second, body);
  BOOST_TEST(replayed2.status == 201u, replayed2.err);
  BOOST_TEST(replayed2.body == made1.body);
  BOOST_TEST(replayed2.field("idempotent-replayed") == "true");
  BOOST_TEST(upstream.count("/pay/b") == 1u);
  // The same key with another body is refused the same way (C13).
  const H2Answer other = curl("POST", "/pay/b", second, R"({"amount":"2.00"})");
  BOOST_TEST(other.status == 422u, other.body);
  BOOST_TEST(upstream.count("/pay/b") == 1u);
  // A required key missing over HTTP/2 (C10).
  const H2Answer missing = curl("POST", "/pay/c", json, body);
  BOOST_TEST(missing.status == 400u, missing.body);
  BOOST_TEST(upstream.count("/pay/c") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C49_identical_keyed_streams_on_one_connection_execute_once) {
  // C19 as 50 streams of one connection: one execution, every stream answered.
  UpstreamReply slow;
  slow.delay = std::chrono::milliseconds(300);
  upstream.on("/pay/storm", {slow});
  const auto statuses = nghttp_streams(
      "/pay/storm", 50, {{"content-type", "application/json"}, {"idempotency-key", "h2-storm"}},
      std::string(R"({"amount":"3.00"})"));
  BOOST_TEST(statuses.size() == 50u, gateway.diagnostics());
  std::size_t created = 0;
  for (const unsigned s : statuses) {
    BOOST_TEST((s == 201u || s == 409u), "status " << s);
    if (s == 201u) ++created;
  }
  BOOST_TEST(created >= 1u);
  BOOST_TEST(upstream.count("/pay/storm") == 1u);
  // Pass-through streams are each forwarded.
  const auto plain = nghttp_streams("/plain", 100, {}, std::nullopt);
  BOOST_TEST(plain.size() == 100u);
  BOOST_TEST(std::count(plain.begin(), plain.end(), 201u) == 100);
  BOOST_TEST(upstream.count("/plain") == 100u);
}

BOOST_AUTO_TEST_CASE(spec_C50_uploads_on_many_streams_at_once_all_arrive_under_flow_control) {
  // 20 streams of one connection upload 60 KiB each at once: more than the connection holds
  // (4 x max_request_body = 256 KiB), so windows are given back as bodies are handled.
  std::string body;
  for (int i = 0; body.size() < 60 * 1024; ++i) body += std::to_string(i) + ";";
  const auto statuses = nghttp_streams("/upload", 20, {{"content-type", "text/plain"}}, body);
  BOOST_TEST(statuses.size() == 20u, gateway.diagnostics());
  BOOST_TEST(std::count(statuses.begin(), statuses.end(), 201u) == 20);
  const auto got = upstream.received("/upload");
  BOOST_TEST_REQUIRE(got.size() == 20u);
  for (const auto& r : got) BOOST_TEST((r.body == body));
}

BOOST_AUTO_TEST_CASE(
    spec_C50_an_upload_past_max_request_body_streams_on_a_route_without_the_contract) {
  // 300 KiB against max_request_body 64 KiB: a request the contract does not hold is streamed
  // (C38), its length kept, or chunked to the upstream when the client gave none.
  std::string body;
  for (int i = 0; body.size() < 300 * 1024; ++i) body += std::to_string(i) + ";";
  const H2Answer sized = curl("POST", "/upload/sized", {{"Content-Type", "text/plain"}}, body);
  BOOST_TEST(sized.status == 201u, sized.body << sized.err);
  BOOST_TEST(sized.version == "2");
  const H2Answer unsized = curl("POST", "/upload/unsized",
                                {{"Content-Type", "text/plain"}, {"Content-Length", ""}}, body);
  BOOST_TEST(unsized.status == 201u, unsized.body << unsized.err);
  const auto got_sized = upstream.received("/upload/sized");
  const auto got_unsized = upstream.received("/upload/unsized");
  BOOST_TEST_REQUIRE(got_sized.size() == 1u);
  BOOST_TEST_REQUIRE(got_unsized.size() == 1u);
  BOOST_TEST((got_sized[0].body == body));
  BOOST_TEST(got_sized[0].value("Content-Length").value_or("") == std::to_string(body.size()));
  BOOST_TEST((got_unsized[0].body == body));
  BOOST_TEST(got_unsized[0].value("Transfer-Encoding").value_or("") == "chunked");
  // A keyed route still holds its body: 413 past max_request_body (C04).
  const H2Answer keyed_big =
      curl("POST", "/pay/big-upload", {{"Idempotency-Key", "h2-big-upload"}}, body);
  BOOST_TEST(keyed_big.status == 413u, keyed_big.body << keyed_big.err);
  BOOST_TEST(upstream.count("/pay/big-upload") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C50_header_list_and_body_limits_answer_on_their_stream) {
  const H2Answer big_header = curl("GET", "/x", {{"X-Big", std::string(5000, 'a')}});
  BOOST_TEST(big_header.status == 431u, big_header.body << big_header.err);
  BOOST_TEST(big_header.body.find("exceeds 4096 bytes") != std::string::npos, big_header.body);
  const H2Answer big_body =
      curl("POST", "/pay/big", {{"Idempotency-Key", "h2-big"}}, std::string(100 * 1024, 'b'));
  BOOST_TEST(big_body.status == 413u, big_body.body << big_body.err);
  BOOST_TEST(upstream.total() == 0u);
  // The connection-level limits do not leak into the next request.
  const H2Answer fine = curl("GET", "/x");
  BOOST_TEST(fine.status == 201u, fine.err);
}

BOOST_AUTO_TEST_CASE(spec_C39_an_answer_past_the_hold_limit_streams_over_h2) {
  std::string big;
  for (int i = 0; big.size() < 300 * 1024; ++i) big += std::to_string(i) + ",";
  upstream.on("/big/file", {{200, {{"Content-Type", "text/plain"}}, big}});
  const H2Answer got = curl("GET", "/big/file");
  BOOST_TEST(got.status == 200u, got.err);
  BOOST_TEST(got.body.size() == big.size());
  BOOST_TEST((got.body == big));
  // The upstream connection went back to the pool after the body: the next request reuses it.
  const H2Answer again = curl("GET", "/big/file");
  BOOST_TEST((again.body == big));
}

BOOST_AUTO_TEST_CASE(spec_C50_sigterm_sends_goaway_and_the_open_stream_finishes) {
  UpstreamReply held;
  held.hold = true;
  upstream.on("/slow", {held});
  ChildOptions o;
  o.executable = "/usr/bin/nghttp";
  o.args = {"-v", url("/slow")};
  o.stdout_path = (gateway.dir() / "nghttp-drain.out").string();
  o.stderr_path = (gateway.dir() / "nghttp-drain.err").string();
  ChildProcess client(o);
  BOOST_TEST_REQUIRE(upstream.wait_for("/slow", 1), gateway.diagnostics());
  gateway.signal(SIGTERM);
  // GOAWAY reaches the client while its stream is still open.
  const bool goaway = eventually(
      [&] { return read_text_file(o.stdout_path).find("recv GOAWAY") != std::string::npos; });
  BOOST_TEST(goaway, read_text_file(o.stdout_path));
  upstream.release();
  const auto status = client.wait_for(std::chrono::milliseconds(20'000));
  BOOST_TEST(status.has_value());
  BOOST_TEST(status.value_or(-1) == 0);
  const std::string out = read_text_file(o.stdout_path);
  BOOST_TEST(out.find(":status: 201") != std::string::npos, out);
  // The drain ends once the stream has: the gateway exits by itself, successfully.
  const auto exited = gateway.wait_for_exit(std::chrono::milliseconds(10'000));
  BOOST_TEST(exited.has_value(), gateway.diagnostics());
  BOOST_TEST(exited.value_or(-1) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
