// Events delivered over HTTP (SPEC C37, §2 `key_source`): the real `idemgate` processes in front
// of the example payment service's POST /events, which records the seed's processed_event and
// counts executions (`events`) and first recordings (`events_recorded`) in GET /stats. Each key
// source — a webhook id header, CloudEvents [ce-source, ce-id], a JSON Pointer, saga id + step —
// runs the same delivery contract on two gateway processes sharing the stores.
#define BOOST_TEST_MODULE events_e2e
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "tests/e2e/gateway_fixture.hpp"

namespace {

namespace json = boost::json;
using namespace idemgate::test;
using namespace idemgate::test::e2e;

constexpr int kGatewayInstances = 2;

/// A way of carrying an event's identity, as a route configures it and a sender sends it.
struct Source {
  std::string name;                ///< also the route name
  std::vector<std::string> extra;  ///< the route's `idempotency` lines besides mode and methods
  /// A delivery of event `id`; `topic` varies the body (same id, other body → C17).
  std::function<HttpRequest(const std::string& id, const std::string& topic)> delivery;
  /// A delivery whose key source is missing altogether.
  std::function<HttpRequest(const std::string& id)> without_key;
};

/// The payment service's event body; `event_id` carries the id for its processed_event table.
std::string event_body(const std::string& id, const std::string& topic) {
  return json::serialize(json::object{{"event_id", id}, {"topic", topic}});
}

HttpRequest post_event(HeaderList headers, std::string body) {
  HttpRequest req;
  req.method = "POST";
  req.target = "/events";
  req.headers = {{"Content-Type", "application/json"}};
  for (auto& h : headers) req.headers.push_back(std::move(h));
  req.body = std::move(body);
  return req;
}

Source webhook_source() {
  return {"webhook",
          {"key_source: { header: X-Webhook-Id }", "concurrency: reject"},
          [](const std::string& id, const std::string& topic) {
            return post_event({{"X-Webhook-Id", id}}, event_body(id, topic));
          },
          [](const std::string& id) { return post_event({}, event_body(id, "orders")); }};
}

/// Binary-mode CloudEvents from one source (CloudEvents HTTP binding §3.1.3).
HttpRequest cloudevent(const std::string& source, const std::string& id, const std::string& body) {
  return post_event({{"ce-specversion", "1.0"},
                     {"ce-type", "com.example.order.created"},
                     {"ce-source", source},
                     {"ce-id", id}},
                    body);
}

Source cloudevents_source() {
  return {"cloudevents",
          {"key_source: { headers: [ce-source, ce-id] }", "concurrency: wait"},
          [](const std::string& id, const std::string& topic) {
            return cloudevent("/orders", id, event_body(id, topic));
          },
          [](const std::string& id) {
            return post_event({{"ce-specversion", "1.0"}, {"ce-type", "com.example.order.created"}},
                              event_body(id, "orders"));
          }};
}

Source json_pointer_source() {
  return {
      "json-event-id",
      {"key_source: { json_pointer: /event_id }", "fingerprint_body: json", "concurrency: wait"},
      [](const std::string& id, const std::string& topic) {
        return post_event({}, event_body(id, topic));
      },
      [](const std::string& id) {
        return post_event({}, json::serialize(json::object{{"id", id}, {"topic", "orders"}}));
      }};
}

Source saga_source() {
  return {
      "saga-step",
      {"key_source: { headers: [X-Saga-Id, X-Saga-Step] }", "concurrency: reject"},
      [](const std::string& id, const std::string& topic) {
        return post_event({{"X-Saga-Id", id}, {"X-Saga-Step", "charge"}}, event_body(id, topic));
      },
      [](const std::string& id) { return post_event({}, event_body(id, "orders")); }};
}

GatewayConfig events_gateway(const PaymentService& service, const Source& source,
                             const std::string& mode = "required") {
  RouteConfig r;
  r.name = source.name;
  r.path_prefix = "/events";
  r.upstream = "events";
  r.match_methods = {"POST"};
  r.mode = mode;
  r.methods = {"POST"};
  r.extra = source.extra;
  GatewayConfig config;
  config.upstreams = {{"events", {service.address()}}};
  config.routes = {r};
  return config;
}

bool replayed(const HttpResponse& res) {
  return res.header("Idempotent-Replayed") == std::optional<std::string>("true");
}

std::string event_status(const HttpResponse& res) {
  boost::system::error_code ec;
  const json::value v = json::parse(res.body, ec);
  if (ec || !v.is_object() || !v.as_object().contains("status")) return "";
  const json::value& status = v.as_object().at("status");
  return status.is_string() ? std::string(status.as_string()) : "";
}

/// Executions and first recordings of the payment service, read together.
struct Counts {
  std::uint64_t events;
  std::uint64_t recorded;
};

Counts counts(const PaymentService& service) {
  return {service.counter("events"), service.counter("events_recorded")};
}

// The delivery contract every key source keeps (SPEC C37 with C15–C19): one execution per
// distinct event, the stored answer for every redelivery on either gateway, 400 without the key
// source, 422 for the same id with another body.
void check_delivery_contract(const Source& source) {
  BOOST_TEST_MESSAGE("key source " << source.name);
  PaymentService service;
  Gateway gateway(events_gateway(service, source), kGatewayInstances);
  const Counts before = counts(service);

  // First delivery: executed once, answered by the upstream.
  const std::string id = unique_name(source.name);
  const HttpResponse first = gateway.send(source.delivery(id, "orders"), 0);
  BOOST_TEST_REQUIRE(first.status == 200u, gateway.explain(first));
  BOOST_TEST(!replayed(first));
  BOOST_TEST(event_status(first) == "processed");
  BOOST_TEST(service.counter("events") == before.events + 1);
  BOOST_TEST(service.counter("events_recorded") == before.recorded + 1);

  // Redeliveries to both gateways: the stored answer, upstream not called.
  for (int i = 0; i < 6; ++i) {
    const HttpResponse again = gateway.send(source.delivery(id, "orders"), i % kGatewayInstances);
    BOOST_TEST(again.status == 200u, gateway.explain(again));
    BOOST_TEST(replayed(again), gateway.explain(again));
    BOOST_TEST(again.body == first.body);
  }
  BOOST_TEST(service.counter("events") == before.events + 1);

  // Concurrent redeliveries of several new events, spread over both gateways: one execution per
  // distinct id; every other answer is the stored one or a 409 while the first is in flight.
  constexpr std::size_t kEvents = 4;
  constexpr std::size_t kDeliveriesEach = 8;
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < kEvents; ++i) ids.push_back(unique_name(source.name));
  const Counts mid = counts(service);
  const auto results =
      run_concurrently(kEvents * kDeliveriesEach, [&](std::size_t i) -> HttpResponse {
        return gateway.send(source.delivery(ids[i % kEvents], "orders"),
                            static_cast<int>(i % kGatewayInstances));
      });
  std::map<std::string, int> executed_answers;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    BOOST_TEST_REQUIRE(r.error.empty(), r.error);
    const unsigned status = r.response.status;
    BOOST_TEST((status == 200u || status == 409u), gateway.explain(r.response));
    if (status == 200u && !replayed(r.response)) ++executed_answers[ids[i % kEvents]];
    if (status == 409u) BOOST_TEST(is_problem(r.response, 409));
  }
  for (const auto& each : ids) BOOST_TEST(executed_answers[each] == 1, each);
  BOOST_TEST(service.counter("events") == mid.events + kEvents);
  BOOST_TEST(service.counter("events_recorded") == mid.recorded + kEvents);
  for (std::size_t i = 0; i < kEvents; ++i) {
    const HttpResponse later =
        gateway.send(source.delivery(ids[i], "orders"), static_cast<int>(i % kGatewayInstances));
    BOOST_TEST(later.status == 200u, gateway.explain(later));
    BOOST_TEST(replayed(later), gateway.explain(later));
    BOOST_TEST(event_status(later) == "processed");
  }
  BOOST_TEST(service.counter("events") == mid.events + kEvents);

  // The key source missing on a required route: 400, not forwarded.
  const Counts quiet = counts(service);
  const HttpResponse missing = gateway.send(source.without_key(unique_name(source.name)), 1);
  BOOST_TEST(is_problem(missing, 400));

  // The same id with another body: a mismatch (C17), and the stored answer stays.
  const HttpResponse other = gateway.send(source.delivery(id, "refunds"), 1);
  BOOST_TEST(is_problem(other, 422));
  const HttpResponse original = gateway.send(source.delivery(id, "orders"), 0);
  BOOST_TEST(replayed(original), gateway.explain(original));
  BOOST_TEST(original.body == first.body);
  BOOST_TEST(service.counter("events") == quiet.events);
}

/// Runs `idemgate check-config FILE` and returns its exit status and output.
struct CheckResult {
  int status = -1;
  std::string out;
  std::string err;
};

CheckResult check_config(const std::filesystem::path& file) {
  const char* binary_dir = std::getenv("IDEMGATE_BINARY_DIR");
  if (binary_dir == nullptr) throw std::runtime_error("IDEMGATE_BINARY_DIR is not set");
  TempDir dir;
  ChildOptions o;
  o.executable = std::string(binary_dir) + "/gateway/idemgate";
  o.args = {"check-config", file.string()};
  o.stdout_path = (dir.path() / "stdout").string();
  o.stderr_path = (dir.path() / "stderr").string();
  ChildProcess child(o);
  CheckResult result;
  result.status = child.wait_for(kEventDeadline).value_or(-1);
  result.out = file_tail(o.stdout_path);
  result.err = file_tail(o.stderr_path);
  return result;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C37_webhook_id_header_executes_each_event_once) {
  check_delivery_contract(webhook_source());
}

BOOST_AUTO_TEST_CASE(spec_C37_cloudevents_source_and_id_execute_each_event_once) {
  check_delivery_contract(cloudevents_source());
}

BOOST_AUTO_TEST_CASE(spec_C37_json_pointer_event_id_executes_each_event_once) {
  check_delivery_contract(json_pointer_source());
}

BOOST_AUTO_TEST_CASE(spec_C37_saga_id_and_step_execute_each_step_once) {
  check_delivery_contract(saga_source());
}

BOOST_AUTO_TEST_CASE(spec_C37_cloudevents_ids_are_unique_per_source_only) {
  PaymentService service;
  Gateway gateway(events_gateway(service, cloudevents_source()));
  const std::string id = unique_name("ce");
  const std::uint64_t before = service.counter("events");
  // Two sources may use the same ce-id: two events, two executions.
  const HttpResponse a = gateway.send(cloudevent("/orders", id, event_body(id + "-orders", "x")));
  const HttpResponse b = gateway.send(cloudevent("/billing", id, event_body(id + "-billing", "x")));
  BOOST_TEST(a.status == 200u, gateway.explain(a));
  BOOST_TEST(b.status == 200u, gateway.explain(b));
  BOOST_TEST(!replayed(a));
  BOOST_TEST(!replayed(b));
  BOOST_TEST(service.counter("events") == before + 2);
  // Only one of the pair, or either one twice, is not a key: 400, not forwarded.
  const HttpResponse no_source = gateway.send(post_event({{"ce-id", id}}, event_body(id, "x")));
  BOOST_TEST(is_problem(no_source, 400));
  const HttpResponse two_ids = gateway.send(post_event(
      {{"ce-source", "/orders"}, {"ce-id", id}, {"ce-id", id + "-2"}}, event_body(id, "x")));
  BOOST_TEST(is_problem(two_ids, 400));
  BOOST_TEST(service.counter("events") == before + 2);
}

BOOST_AUTO_TEST_CASE(spec_C37_saga_next_step_is_a_new_key) {
  PaymentService service;
  Gateway gateway(events_gateway(service, saga_source()));
  const std::string saga = unique_name("saga");
  const std::uint64_t before = service.counter("events");
  const auto step = [&](const std::string& name, const std::string& event_id) {
    return gateway.send(
        post_event({{"X-Saga-Id", saga}, {"X-Saga-Step", name}}, event_body(event_id, "saga")));
  };
  const HttpResponse charge = step("charge", saga + "-charge");
  const HttpResponse ship = step("ship", saga + "-ship");
  const HttpResponse charge_again = step("charge", saga + "-charge");
  BOOST_TEST(charge.status == 200u, gateway.explain(charge));
  BOOST_TEST(!replayed(ship), gateway.explain(ship));
  BOOST_TEST(replayed(charge_again), gateway.explain(charge_again));
  BOOST_TEST(service.counter("events") == before + 2);
}

BOOST_AUTO_TEST_CASE(spec_C37_json_body_without_a_usable_key_is_rejected_before_the_upstream) {
  PaymentService service;
  Gateway gateway(events_gateway(service, json_pointer_source()));
  const std::uint64_t before = service.counter("events");
  const std::string id = unique_name("json");
  struct Case {
    const char* what;
    std::string body;
  };
  const std::vector<Case> cases = {
      {"pointer absent", R"({"id":")" + id + R"(","topic":"orders"})"},
      {"not JSON", "event_id=" + id},
      {"empty body", ""},
      {"truncated JSON", R"({"event_id":")" + id + R"(")"},
      {"id of another type", R"({"event_id":{"id":")" + id + R"("}})"},
      {"id too long", R"({"event_id":")" + std::string(256, 'e') + R"("})"},
      {"event_id twice", R"({"event_id":")" + id + R"(","event_id":")" + id + R"(-b"})"},
  };
  for (const auto& c : cases) {
    const HttpResponse res = gateway.send(post_event({}, c.body));
    BOOST_TEST(is_problem(res, 400), c.what);
  }
  BOOST_TEST(service.counter("events") == before);
}

BOOST_AUTO_TEST_CASE(spec_C35_C37_json_event_redelivered_with_other_member_order_is_replayed) {
  PaymentService service;
  Gateway gateway(events_gateway(service, json_pointer_source()));
  const std::string id = unique_name("json");
  const HttpResponse first =
      gateway.send(post_event({}, R"({"event_id":")" + id + R"(","topic":"orders"})"));
  const HttpResponse again =
      gateway.send(post_event({}, R"({ "topic": "orders", "event_id": ")" + id + R"(" })"));
  BOOST_TEST(first.status == 200u, gateway.explain(first));
  BOOST_TEST(replayed(again), gateway.explain(again));
  BOOST_TEST(again.body == first.body);
}

BOOST_AUTO_TEST_CASE(spec_C37_optional_route_forwards_a_missing_source_and_rejects_an_invalid_one) {
  PaymentService service;
  GatewayConfig config;
  config.upstreams = {{"events", {service.address()}}};
  // One optional route per source kind, told apart by Host.
  config.routes_yaml =
      "  - name: hooks\n"
      "    match: { host: hooks.test, path: /events }\n"
      "    upstream: events\n"
      "    idempotency: { mode: optional, key_source: { header: X-Webhook-Id } }\n"
      "  - name: json\n"
      "    match: { host: json.test, path: /events }\n"
      "    upstream: events\n"
      "    idempotency: { mode: optional, key_source: { json_pointer: /event_id } }\n";
  Gateway gateway(config);
  const auto on = [](const std::string& host, HttpRequest req) {
    req.headers.insert(req.headers.begin(), {"Host", host});
    return req;
  };
  const std::string id = unique_name("opt");
  const std::uint64_t before = service.counter("events");

  // Missing: forwarded each time, without deduplication.
  for (int i = 0; i < 2; ++i) {
    const HttpResponse hook = gateway.send(on("hooks.test", post_event({}, event_body(id, "x"))));
    BOOST_TEST(hook.status == 200u, gateway.explain(hook));
    BOOST_TEST(!replayed(hook));
    const HttpResponse body =
        gateway.send(on("json.test", post_event({}, R"({"id":")" + id + R"("})")));
    BOOST_TEST(!replayed(body), gateway.explain(body));
  }
  BOOST_TEST(service.counter("events") == before + 4);

  // Present but invalid: 400, not forwarded.
  const std::vector<HttpRequest> invalid = {
      on("hooks.test", post_event({{"X-Webhook-Id", ""}}, event_body(id, "x"))),
      on("hooks.test", post_event({{"X-Webhook-Id", "a"}, {"X-Webhook-Id", "b"}}, "{}")),
      on("hooks.test", post_event({{"X-Webhook-Id", "a, b"}}, event_body(id, "x"))),
      on("hooks.test", post_event({{"X-Webhook-Id", std::string(256, 'w')}}, "{}")),
      on("json.test", post_event({}, "not json")),
      on("json.test", post_event({}, R"({"event_id":true})")),
      on("json.test", post_event({}, R"({"event_id":"a","event_id":"b"})")),
  };
  for (std::size_t i = 0; i < invalid.size(); ++i) {
    const HttpResponse res = gateway.send(invalid[i]);
    BOOST_TEST(is_problem(res, 400), "case " << i);
  }
  BOOST_TEST(service.counter("events") == before + 4);
}

BOOST_AUTO_TEST_CASE(spec_C37_idempotency_key_header_is_ignored_for_dedup_and_forwarded_unchanged) {
  TestUpstream upstream;
  RouteConfig r;
  r.name = "hooks";
  r.path_prefix = "/hooks";
  r.upstream = "hooks";
  r.mode = "required";
  // upstream_key applies to the Idempotency-Key source only: here it must change nothing.
  r.extra = {"key_source: { header: X-Webhook-Id }", "upstream_key: strip"};
  GatewayConfig config;
  config.upstreams = {{"hooks", {upstream.address()}}};
  config.routes = {r};
  Gateway gateway(config);
  const std::string w1 = unique_name("hook");
  const std::string w2 = unique_name("hook");
  const auto deliver = [&](const std::string& webhook_id, HeaderList idempotency_key) {
    HeaderList h = {{"Content-Type", "application/json"}, {"X-Webhook-Id", webhook_id}};
    for (auto& f : idempotency_key) h.push_back(std::move(f));
    return gateway.send(HttpRequest{"POST", "/hooks", h, R"({"n":1})"});
  };

  const HttpResponse a = deliver(w1, {{"Idempotency-Key", "\"k-1\""}});
  BOOST_TEST_REQUIRE(a.status == 201u, gateway.explain(a));
  // Another Idempotency-Key, same webhook id: the stored answer.
  const HttpResponse b = deliver(w1, {{"Idempotency-Key", "k-2"}});
  BOOST_TEST(replayed(b), gateway.explain(b));
  // The same Idempotency-Key, another webhook id: a new execution.
  const HttpResponse c = deliver(w2, {{"Idempotency-Key", "\"k-1\""}});
  BOOST_TEST(c.status == 201u, gateway.explain(c));
  BOOST_TEST(!replayed(c));
  // Not even its syntax is checked: it is not the key here.
  const std::string w3 = unique_name("hook");
  const HttpResponse d = deliver(w3, {{"Idempotency-Key", "a, b"}, {"Idempotency-Key", "c"}});
  BOOST_TEST(d.status == 201u, gateway.explain(d));
  // Nor does it stand in for the configured source.
  HttpRequest only_key{"POST", "/hooks", {{"Idempotency-Key", "k-3"}}, "{}"};
  BOOST_TEST(is_problem(gateway.send(only_key), 400));

  const auto received = upstream.received("/hooks");
  BOOST_TEST_REQUIRE(received.size() == 3u);
  BOOST_TEST(received[0].values("Idempotency-Key") == std::vector<std::string>{"\"k-1\""},
             boost::test_tools::per_element());
  BOOST_TEST(received[1].values("Idempotency-Key") == std::vector<std::string>{"\"k-1\""},
             boost::test_tools::per_element());
  BOOST_TEST(received[2].values("Idempotency-Key") == (std::vector<std::string>{"a, b", "c"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(shipped_example_configurations_pass_check_config) {
  const char* source_dir = std::getenv("IDEMGATE_SOURCE_DIR");
  BOOST_TEST_REQUIRE(source_dir != nullptr, "IDEMGATE_SOURCE_DIR is not set");
  const std::filesystem::path conf = std::filesystem::path(source_dir) / "conf";
  std::vector<std::filesystem::path> files = {conf / "demo.yaml"};
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(conf / "examples")) {
    if (entry.path().extension() != ".yaml") continue;
    files.push_back(entry.path());
    names.insert(entry.path().filename().string());
  }
  for (const char* expected :
       {"webhook-receiver.yaml", "cloudevents.yaml", "json-event-id.yaml", "saga-step.yaml"}) {
    BOOST_TEST(names.count(expected) == 1u, expected);
  }
  for (const auto& file : files) {
    const CheckResult result = check_config(file);
    BOOST_TEST(result.status == 0, file.filename() << ": " << result.out << result.err);
    BOOST_TEST(result.out.find(": ok") != std::string::npos, file.filename() << ": " << result.out);
    // An example teaches: a warning (e.g. a setting without effect) would teach a mistake.
    BOOST_TEST(result.err.empty(), file.filename() << ": " << result.err);
  }
}
