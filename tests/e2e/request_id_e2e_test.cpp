// Request ids and traces end to end (conf/REFERENCE.md, "request_id"; the access line of SPEC
// C32): the real idemgate in front of the in-test upstream, which shows what it received, with
// Postgres and Redis from the environment. Each request has a target of its own, by which its
// access line is found in the gateway's stderr.
#define BOOST_TEST_MODULE request_id_e2e
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"

namespace {

namespace json = boost::json;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using Clock = std::chrono::steady_clock;
using Strings = std::vector<std::string>;

const std::string kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const std::string kTraceId = "4bf92f3577b34da6a3ce929d0e0e4736";

bool is_uuid_v4(const std::string& s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (s[i] == '-')) return false;
    if (!dash && !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  }
  return s[14] == '4' && std::string("89ab").find(s[19]) != std::string::npos;
}

std::string str(const json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : "<" + std::string(key) + " absent>";
}

/// Routes: `keyed` (/keyed/, mode required: held, SPEC §4), `plain` (/plain/, mode off:
/// streamed, C38) and `down` (/down/, mode off, an upstream that refuses connections).
GatewayConfig ids_config(const TestUpstream& upstream, std::string request_id = "") {
  GatewayConfig config;
  config.upstreams = {{"up", {upstream.address()}},
                      {"down", {kLoopback + ":" + std::to_string(free_port())}}};
  RouteConfig keyed;
  keyed.name = "keyed";
  keyed.path_prefix = "/keyed/";
  keyed.upstream = "up";
  keyed.mode = "required";
  keyed.methods = {"POST"};
  RouteConfig plain;
  plain.name = "plain";
  plain.path_prefix = "/plain/";
  plain.upstream = "up";
  RouteConfig down;
  down.name = "down";
  down.path_prefix = "/down/";
  down.upstream = "down";
  config.routes = {keyed, plain, down};
  config.request_id = std::move(request_id);
  return config;
}

HttpRequest get(const std::string& target, HeaderList headers = {}) {
  HttpRequest request;
  request.target = target;
  request.headers = std::move(headers);
  return request;
}

/// The access lines of the gateway's log whose `field` is `value`, once there are at least
/// `count` of them (access lines are written in batches, every 50 ms). Fails the test after
/// kEventDeadline.
std::vector<json::object> access_lines_with(const Gateway& gateway, const char* field,
                                            const std::string& value, std::size_t count = 1) {
  const auto deadline = Clock::now() + kEventDeadline;
  for (;;) {
    std::vector<json::object> found;
    std::istringstream in(gateway.stderr_text());
    for (std::string line; std::getline(in, line);) {
      boost::system::error_code ec;
      auto parsed = json::parse(line, ec);
      if (ec || !parsed.is_object()) continue;
      const auto& o = parsed.as_object();
      if (str(o, "msg") == "access" && str(o, field) == value) found.push_back(o);
    }
    if (found.size() >= count) return found;
    if (Clock::now() > deadline) {
      BOOST_FAIL("fewer than " << count << " access lines with " << field << " " << value << "\n"
                               << gateway.diagnostics());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// The one access line whose `field` is `value`. Lines of requests served by different io
/// threads may reach the log in any order, so tests find a line by its own id or target.
json::object access_line_with(const Gateway& gateway, const char* field, const std::string& value) {
  const auto lines = access_lines_with(gateway, field, value);
  BOOST_TEST(lines.size() == 1u, field << " " << value << ": " << lines.size() << " access lines");
  return lines.front();
}

json::object access_line(const Gateway& gateway, const std::string& target) {
  return access_line_with(gateway, "target", target);
}

/// The X-Request-Id the upstream received with the only request for `target`.
Strings forwarded_ids(const TestUpstream& upstream, const std::string& target,
                      const char* field = "X-Request-Id") {
  const auto got = upstream.received(target);
  BOOST_TEST_REQUIRE(got.size() == 1u, target << ": " << got.size() << " requests upstream");
  return got.front().values(field);
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C32_received_request_id_is_forwarded_unchanged_returned_and_logged) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  for (const std::string prefix : {"/plain/", "/keyed/"}) {
    const std::string target = prefix + unique_name("received");
    const std::string id = "client:" + unique_name("id") + "/a;b=\"c\"";
    const HttpRequest request =
        prefix == "/plain/" ? get(target, {{"X-Request-Id", id}})
                            : keyed_post(target, unique_name("key"), "{}", {{"X-Request-Id", id}});
    const HttpResponse res = gateway.send(request);
    BOOST_TEST(res.status == 201u, gateway.explain(res));
    BOOST_TEST(res.header_values("X-Request-Id") == Strings{id}, describe(res));
    BOOST_TEST(forwarded_ids(upstream, target) == Strings{id});
    const auto line = access_line(gateway, target);
    BOOST_TEST(str(line, "request_id") == id, json::serialize(line));
    BOOST_TEST(str(line, "trace_id") == "", json::serialize(line));
  }
}

BOOST_AUTO_TEST_CASE(spec_C32_absent_request_id_is_generated_forwarded_returned_and_logged) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  std::set<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    for (const std::string prefix : {"/plain/", "/keyed/"}) {
      const std::string target = prefix + unique_name("generated");
      const HttpRequest request =
          prefix == "/plain/" ? get(target) : keyed_post(target, unique_name("key"), "{}");
      const HttpResponse res = gateway.send(request);
      BOOST_TEST(res.status == 201u, gateway.explain(res));
      const Strings returned = res.header_values("X-Request-Id");
      BOOST_TEST_REQUIRE(returned.size() == 1u, describe(res));
      const std::string id = returned.front();
      BOOST_TEST(is_uuid_v4(id), id);
      BOOST_TEST(forwarded_ids(upstream, target) == Strings{id});
      BOOST_TEST(str(access_line(gateway, target), "request_id") == id);
      ids.insert(id);
    }
  }
  BOOST_TEST(ids.size() == 4u, "a generated id was repeated");
}

BOOST_AUTO_TEST_CASE(spec_C32_unreasonable_request_id_is_replaced_by_a_generated_one) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  const std::vector<HeaderList> sent = {
      {{"X-Request-Id", std::string(201, 'a')}},
      {{"X-Request-Id", "two words"}},
      {{"X-Request-Id", "caf\xc3\xa9"}},
      {{"X-Request-Id", "one"}, {"X-Request-Id", "two"}},
  };
  for (const auto& fields : sent) {
    const std::string target = "/plain/" + unique_name("replaced");
    const HttpResponse res = gateway.send(get(target, fields));
    BOOST_TEST(res.status == 201u, gateway.explain(res));
    const Strings returned = res.header_values("X-Request-Id");
    BOOST_TEST_REQUIRE(returned.size() == 1u, describe(res));
    BOOST_TEST(is_uuid_v4(returned.front()), returned.front());
    BOOST_TEST(forwarded_ids(upstream, target) == returned);
    BOOST_TEST(str(access_line(gateway, target), "request_id") == returned.front());
  }
}

BOOST_AUTO_TEST_CASE(spec_C32_without_generate_only_the_clients_valid_id_is_used) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream, "{ generate: false }")};
  {
    const std::string target = "/plain/" + unique_name("absent");
    const HttpResponse res = gateway.send(get(target));
    BOOST_TEST(res.status == 201u, gateway.explain(res));
    BOOST_TEST(res.header_count("X-Request-Id") == 0u, describe(res));
    BOOST_TEST(forwarded_ids(upstream, target).empty());
    BOOST_TEST(str(access_line(gateway, target), "request_id") == "");
  }
  {
    const std::string target = "/keyed/" + unique_name("absent");
    const HttpResponse res = gateway.send(keyed_post(target, unique_name("key"), "{}"));
    BOOST_TEST(res.status == 201u, gateway.explain(res));
    BOOST_TEST(res.header_count("X-Request-Id") == 0u, describe(res));
    BOOST_TEST(forwarded_ids(upstream, target).empty());
    BOOST_TEST(str(access_line(gateway, target), "request_id") == "");
  }
  {
    const std::string target = "/plain/" + unique_name("valid");
    const HttpResponse res = gateway.send(get(target, {{"X-Request-Id", "client-7"}}));
    BOOST_TEST(res.header_values("X-Request-Id") == Strings{"client-7"}, describe(res));
    BOOST_TEST(forwarded_ids(upstream, target) == Strings{"client-7"});
    BOOST_TEST(str(access_line(gateway, target), "request_id") == "client-7");
  }
  {
    // Forwarded as received, but it is not an id the gateway returns or logs.
    const std::string target = "/plain/" + unique_name("invalid");
    const HttpResponse res = gateway.send(get(target, {{"X-Request-Id", "two words"}}));
    BOOST_TEST(res.header_count("X-Request-Id") == 0u, describe(res));
    BOOST_TEST(forwarded_ids(upstream, target) == Strings{"two words"});
    BOOST_TEST(str(access_line(gateway, target), "request_id") == "");
  }
}

BOOST_AUTO_TEST_CASE(spec_C32_valid_traceparent_is_forwarded_unchanged_and_its_trace_id_logged) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  for (const std::string prefix : {"/plain/", "/keyed/"}) {
    const std::string target = prefix + unique_name("trace");
    const HeaderList fields = {{"traceparent", kTraceparent}, {"tracestate", "vendor=opaque"}};
    const HttpRequest request = prefix == "/plain/"
                                    ? get(target, fields)
                                    : keyed_post(target, unique_name("key"), "{}", fields);
    const HttpResponse res = gateway.send(request);
    BOOST_TEST(res.status == 201u, gateway.explain(res));
    BOOST_TEST(forwarded_ids(upstream, target, "traceparent") == Strings{kTraceparent});
    BOOST_TEST(forwarded_ids(upstream, target, "tracestate") == Strings{"vendor=opaque"});
    const auto line = access_line(gateway, target);
    BOOST_TEST(str(line, "trace_id") == kTraceId, json::serialize(line));
    BOOST_TEST(is_uuid_v4(str(line, "request_id")), json::serialize(line));
  }
}

BOOST_AUTO_TEST_CASE(spec_C32_malformed_traceparent_is_forwarded_untouched_and_not_logged) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  for (const std::string& bad : {
           std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
           std::string("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           std::string("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"),
       }) {
    for (const std::string prefix : {"/plain/", "/keyed/"}) {
      const std::string target = prefix + unique_name("badtrace");
      const HeaderList fields = {{"traceparent", bad}};
      const HttpRequest request = prefix == "/plain/"
                                      ? get(target, fields)
                                      : keyed_post(target, unique_name("key"), "{}", fields);
      const HttpResponse res = gateway.send(request);
      BOOST_TEST(res.status == 201u, gateway.explain(res));
      BOOST_TEST(forwarded_ids(upstream, target, "traceparent") == Strings{bad});
      const auto line = access_line(gateway, target);
      BOOST_TEST(str(line, "trace_id") == "", bad << ": " << json::serialize(line));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C16_a_replay_carries_the_replaying_requests_id) {
  TestUpstream upstream;
  const std::string target = "/keyed/" + unique_name("replay");
  const std::string key = unique_name("key");
  // The upstream answers with an id of its own, which the record keeps as it was.
  UpstreamReply reply;
  reply.headers = {{"Content-Type", "application/json"}, {"X-Request-Id", "upstream-own"}};
  upstream.on(target, {reply});
  const GatewayConfig config = ids_config(upstream);
  {
    Gateway gateway{config};
    const HttpResponse first =
        gateway.send(keyed_post(target, key, "{}", {{"X-Request-Id", "first-request"}}));
    BOOST_TEST(first.status == 201u, gateway.explain(first));
    BOOST_TEST(first.header_values("X-Request-Id") == Strings{"first-request"}, describe(first));
    BOOST_TEST(forwarded_ids(upstream, target) == Strings{"first-request"});

    const HttpResponse again =
        gateway.send(keyed_post(target, key, "{}", {{"X-Request-Id", "second-request"}}));
    BOOST_TEST(again.status == 201u, gateway.explain(again));
    BOOST_TEST(again.header("Idempotent-Replayed").value_or("") == "true", describe(again));
    BOOST_TEST(again.header_values("X-Request-Id") == Strings{"second-request"}, describe(again));
    BOOST_TEST(again.body == first.body);

    const HttpResponse unnamed = gateway.send(keyed_post(target, key, "{}"));
    BOOST_TEST(unnamed.header("Idempotent-Replayed").value_or("") == "true", describe(unnamed));
    const Strings generated = unnamed.header_values("X-Request-Id");
    BOOST_TEST_REQUIRE(generated.size() == 1u, describe(unnamed));
    BOOST_TEST(is_uuid_v4(generated.front()), generated.front());
    BOOST_TEST(upstream.count(target) == 1u, "a replay reached the upstream");

    for (const auto& [id, outcome] : {std::pair{std::string("first-request"), "executed"},
                                      std::pair{std::string("second-request"), "replayed"},
                                      std::pair{generated.front(), "replayed"}}) {
      const auto line = access_line_with(gateway, "request_id", id);
      BOOST_TEST(str(line, "target") == target, json::serialize(line));
      BOOST_TEST(str(line, "outcome") == outcome, json::serialize(line));
    }
  }
  // With ids off, a replay shows the stored response's own field, untouched.
  GatewayConfig off = config;
  off.request_id = "{ generate: false }";
  Gateway gateway{off};
  const HttpResponse stored = gateway.send(keyed_post(target, key, "{}"));
  BOOST_TEST(stored.header("Idempotent-Replayed").value_or("") == "true", gateway.explain(stored));
  BOOST_TEST(stored.header_values("X-Request-Id") == Strings{"upstream-own"}, describe(stored));
}

BOOST_AUTO_TEST_CASE(spec_C33_the_gateways_own_answers_carry_the_request_id) {
  TestUpstream upstream;
  Gateway gateway{ids_config(upstream)};
  const auto check = [&](const HttpResponse& res, unsigned status, const std::string& target,
                         const std::string& id) {
    BOOST_TEST(is_problem(res, status));
    BOOST_TEST(res.header_values("X-Request-Id") == Strings{id}, describe(res));
    const auto line = access_line(gateway, target);
    BOOST_TEST(line.at("status").to_number<unsigned>() == status, json::serialize(line));
    BOOST_TEST(str(line, "request_id") == id, json::serialize(line));
  };

  const std::string nowhere = "/nowhere/" + unique_name("x");
  check(gateway.send(get(nowhere, {{"X-Request-Id", "no-route"}})), 404, nowhere, "no-route");

  const std::string missing = "/keyed/" + unique_name("missing");
  check(gateway.send(keyed_post(missing, std::nullopt, "{}", {{"X-Request-Id", "no-key"}})), 400,
        missing, "no-key");

  const std::string down = "/down/" + unique_name("down");
  check(gateway.send(get(down, {{"X-Request-Id", "down-1"}})), 502, down, "down-1");

  // A body declared over max_request_body is refused from the parsed header: the id is read.
  const std::string large = "/keyed/" + unique_name("large");
  {
    auto connection = gateway.connect();
    connection->send_raw("POST " + large +
                         " HTTP/1.1\r\nHost: gateway.test\r\nIdempotency-Key: k\r\n"
                         "X-Request-Id: too-large\r\nContent-Length: 2000000\r\n\r\n");
    check(connection->read_response(), 413, large, "too-large");
  }

  // A key reused with another body (C17), and one still in flight (C18).
  const std::string mismatch = "/keyed/" + unique_name("mismatch");
  const std::string key = unique_name("key");
  BOOST_TEST(gateway.send(keyed_post(mismatch, key, "{\"a\":1}")).status == 201u);
  const HttpResponse other =
      gateway.send(keyed_post(mismatch, key, "{\"a\":2}", {{"X-Request-Id", "mismatch-2"}}));
  BOOST_TEST(is_problem(other, 422));
  BOOST_TEST(other.header_values("X-Request-Id") == Strings{"mismatch-2"}, describe(other));
  const auto mismatch_line = access_line_with(gateway, "request_id", "mismatch-2");
  BOOST_TEST(str(mismatch_line, "target") == mismatch, json::serialize(mismatch_line));
  BOOST_TEST(str(mismatch_line, "outcome") == "mismatch", json::serialize(mismatch_line));

  const std::string held = "/keyed/" + unique_name("held");
  UpstreamReply hold;
  hold.hold = true;
  upstream.on(held, {hold});
  const std::string held_key = unique_name("key");
  auto first = std::async(std::launch::async, [&] {
    return gateway.send(keyed_post(held, held_key, "{}", {{"X-Request-Id", "held-1"}}));
  });
  BOOST_TEST_REQUIRE(upstream.wait_for(held, 1), gateway.diagnostics());
  const HttpResponse busy =
      gateway.send(keyed_post(held, held_key, "{}", {{"X-Request-Id", "held-2"}}));
  upstream.release();
  BOOST_TEST(is_problem(busy, 409));
  BOOST_TEST(busy.header_values("X-Request-Id") == Strings{"held-2"}, describe(busy));
  BOOST_TEST(str(access_line_with(gateway, "request_id", "held-2"), "outcome") == "in_flight");
  BOOST_TEST(first.get().header_values("X-Request-Id") == Strings{"held-1"});

  // A header section the gateway refuses to read (C03, C04) gets a generated id: no field of it
  // is trusted, the client's id included.
  const std::string framing = "/plain/" + unique_name("framing");
  const std::string big = "/plain/" + unique_name("big");
  for (const auto& [status, raw] :
       {std::pair{400u, "POST " + framing +
                            " HTTP/1.1\r\nHost: gateway.test\r\nX-Request-Id: framing-1\r\n"
                            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
        std::pair{431u, "GET " + big +
                            " HTTP/1.1\r\nHost: gateway.test\r\nX-Request-Id: big-1\r\n"
                            "X-Big: " +
                            std::string(9000, 'b') + "\r\n\r\n"}}) {
    auto connection = gateway.connect();
    connection->send_raw(raw);
    const HttpResponse res = connection->read_response();
    BOOST_TEST(is_problem(res, status));
    const Strings ids = res.header_values("X-Request-Id");
    BOOST_TEST_REQUIRE(ids.size() == 1u, describe(res));
    BOOST_TEST(is_uuid_v4(ids.front()), ids.front());
    const auto line = access_line_with(gateway, "request_id", ids.front());
    BOOST_TEST(line.at("status").to_number<unsigned>() == status, json::serialize(line));
  }
}
