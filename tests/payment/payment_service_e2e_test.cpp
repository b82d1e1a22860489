// End-to-end tests of the example upstream, examples/payment-service: the real binary as a
// child process against the Postgres in IDEMGATE_PAYMENTS_DSN. Its UNIQUE (provider,
// external_payment_id) is the second layer behind the gateway (seed R-DIST-IDEM-4, SPEC C21).
#define BOOST_TEST_MODULE payment_service_e2e
#include <libpq-fe.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"

namespace {

namespace json = boost::json;
using idemgate::test::ChildOptions;
using idemgate::test::ChildProcess;
using idemgate::test::HttpConnection;
using idemgate::test::HttpRequest;
using idemgate::test::HttpResponse;

const std::string kHost = "127.0.0.1";
/// How long a test waits for an event (a port, a process's exit) before it fails: a safety net
/// against hangs, not a measured threshold.
constexpr std::chrono::seconds kEventDeadline{30};

// A name no earlier run of this suite used, so tests need no clean database.
std::string unique(const std::string& prefix) {
  static const std::string run = [] {
    std::random_device rd;
    std::ostringstream s;
    s << std::hex << rd() << rd();
    return s.str();
  }();
  static std::atomic<int> counter{0};
  return prefix + "-" + run + "-" + std::to_string(++counter);
}

std::string payments_dsn() {
  return idemgate::test::require_env("IDEMGATE_PAYMENTS_DSN");
}

std::string binary() {
  return idemgate::test::require_env("IDEMGATE_BINARY_DIR") +
         "/examples/payment-service/payment-service";
}

// The payment service on a free loopback port, stopped by PID when destroyed.
struct PaymentService {
  std::uint16_t port = 0;
  std::string log_path;
  ChildProcess child;

  static ChildOptions options(std::uint16_t port, const std::string& log_path,
                              const std::string& dsn, std::vector<std::string> extra) {
    ChildOptions o;
    o.executable = binary();
    o.args = {"--listen", kHost + ":" + std::to_string(port), "--dsn", dsn};
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    o.stderr_path = log_path;
    return o;
  }

  explicit PaymentService(std::vector<std::string> extra = {}, std::string dsn = payments_dsn())
      : port(idemgate::test::free_port()),
        log_path(
            (std::filesystem::temp_directory_path() / ("payment-service-" + unique("log") + ".log"))
                .string()),
        child(options(port, log_path, dsn, std::move(extra))) {}

  ~PaymentService() {
    child.stop();
    std::error_code ignored;
    std::filesystem::remove(log_path, ignored);
  }
  PaymentService(const PaymentService&) = delete;
  PaymentService& operator=(const PaymentService&) = delete;

  // Separate from construction so several instances can be started before any is awaited.
  void await_ready() {
    if (!idemgate::test::wait_for_port(kHost, port, kEventDeadline, &child))
      BOOST_FAIL("payment-service did not start; its stderr:\n" + log());
    // Listening comes before nothing else, but /healthz is the documented readiness answer.
    const HttpResponse health = get("/healthz");
    BOOST_REQUIRE_EQUAL(health.status, 200u);
  }

  std::string log() const { return idemgate::test::read_text_file(log_path); }

  HttpResponse send(const HttpRequest& request) const {
    return idemgate::test::http_request(kHost, port, request);
  }
  HttpResponse get(const std::string& target) const { return send({"GET", target, {}, ""}); }
  HttpResponse post(const std::string& target, const std::string& body) const {
    return send({"POST", target, {{"Content-Type", "application/json"}}, body});
  }

  json::object stats() const {
    const HttpResponse res = get("/stats");
    BOOST_REQUIRE_EQUAL(res.status, 200u);
    return json::parse(res.body).as_object();
  }
};

std::uint64_t counter(const json::object& stats, const char* name) {
  return stats.at(name).to_number<std::uint64_t>();
}

// One instance shared by the tests that do not need special options.
PaymentService& shared_service() {
  static std::unique_ptr<PaymentService> service = [] {
    auto s = std::make_unique<PaymentService>();
    s->await_ready();
    return s;
  }();
  return *service;
}

std::string payment_body(const std::string& provider, const std::string& external_id,
                         const std::string& amount_json = "\"10.5\"") {
  return R"({"order_id":"order-1","customer_id":"customer-1","provider":")" + provider +
         R"(","external_payment_id":")" + external_id + R"(","amount":)" + amount_json + "}";
}

// A direct look at the table, to check rows rather than what the service says about them.
class Pg {
 public:
  explicit Pg(const std::string& dsn) : conn_(PQconnectdb(dsn.c_str()), &PQfinish) {
    BOOST_REQUIRE_MESSAGE(PQstatus(conn_.get()) == CONNECTION_OK, PQerrorMessage(conn_.get()));
  }
  // The first column of the first row ("" for no row).
  std::string scalar(const std::string& sql, std::vector<std::string> params = {}) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    std::unique_ptr<PGresult, decltype(&PQclear)> r{
        PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(values.size()), nullptr,
                     values.data(), nullptr, nullptr, 0),
        &PQclear};
    const auto status = PQresultStatus(r.get());
    BOOST_REQUIRE_MESSAGE(status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK,
                          sql + ": " + PQerrorMessage(conn_.get()));
    if (PQntuples(r.get()) == 0) return "";
    return PQgetvalue(r.get(), 0, 0);
  }

 private:
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_;
};

void require_problem(const HttpResponse& res, unsigned status, const std::string& detail_part) {
  BOOST_TEST_CONTEXT("body: " << res.body) {
    BOOST_TEST(res.status == status);
    BOOST_TEST(res.header("Content-Type").value_or("") == "application/problem+json");
    BOOST_TEST(res.header("Content-Length").value_or("") == std::to_string(res.body.size()));
    const json::object problem = json::parse(res.body).as_object();
    BOOST_TEST(problem.contains("type"));
    BOOST_TEST(problem.contains("title"));
    BOOST_TEST(problem.at("status").to_number<unsigned>() == status);
    const std::string detail(problem.at("detail").as_string());
    BOOST_TEST(detail.find(detail_part) != std::string::npos, detail << " names " << detail_part);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(
    spec_C21_second_post_with_same_provider_and_external_id_returns_first_payment) {
  PaymentService& service = shared_service();
  const json::object before = service.stats();
  const std::string external_id = unique("ext");

  const HttpResponse first = service.post("/payments", payment_body("stripe", external_id));
  BOOST_TEST_REQUIRE(first.status == 201u, first.body);
  const json::object created = json::parse(first.body).as_object();
  const std::int64_t id = created.at("id").as_int64();
  BOOST_TEST(created.at("status").as_string() == "created");
  BOOST_TEST(first.header("Location").value_or("") == "/payments/" + std::to_string(id));
  BOOST_TEST(first.header("Content-Length").value_or("") == std::to_string(first.body.size()));

  // Another retry mechanism, other order fields: the constraint still finds the first row.
  std::string other = payment_body("stripe", external_id, "99");
  const HttpResponse second = service.post("/payments", other);
  BOOST_TEST_REQUIRE(second.status == 200u, second.body);
  const json::object existing = json::parse(second.body).as_object();
  BOOST_TEST(existing.at("id").as_int64() == id);
  BOOST_TEST(existing.at("amount").as_string() == "10.5000");
  BOOST_TEST(!second.header("Location").has_value());

  // Another provider with the same external id is another payment.
  const HttpResponse third = service.post("/payments", payment_body("adyen", external_id));
  BOOST_TEST_REQUIRE(third.status == 201u, third.body);
  BOOST_TEST(json::parse(third.body).at("id").as_int64() != id);

  const json::object after = service.stats();
  BOOST_TEST(counter(after, "payment_posts") - counter(before, "payment_posts") == 3u);
  BOOST_TEST(counter(after, "payments_inserted") - counter(before, "payments_inserted") == 2u);
  Pg pg(payments_dsn());
  BOOST_TEST(pg.scalar("SELECT count(*) FROM payment WHERE external_payment_id = $1",
                       {external_id}) == "2");
}

BOOST_AUTO_TEST_CASE(fifty_concurrent_identical_posts_insert_exactly_one_row) {
  // A fresh instance so its counters are this test's alone; the delay keeps every request in
  // flight while the others arrive.
  PaymentService service({"--delay-ms", "300"});
  service.await_ready();
  const std::string external_id = unique("concurrent");
  const std::string body = payment_body("stripe", external_id, "\"42.4242\"");

  constexpr int kClients = 50;
  std::vector<HttpResponse> responses(kClients);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      try {
        responses[i] = service.post("/payments", body);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : clients) t.join();

  int created = 0;
  std::set<std::int64_t> ids;
  for (int i = 0; i < kClients; ++i) {
    BOOST_TEST_REQUIRE(errors[i].empty(), errors[i]);
    BOOST_TEST_REQUIRE((responses[i].status == 201u || responses[i].status == 200u),
                       responses[i].status << " " << responses[i].body);
    created += responses[i].status == 201u;
    ids.insert(json::parse(responses[i].body).at("id").as_int64());
  }
  BOOST_TEST(created == 1);
  BOOST_TEST(ids.size() == 1u);

  const json::object stats = service.stats();
  BOOST_TEST(counter(stats, "payment_posts") == 50u);
  BOOST_TEST(counter(stats, "payments_inserted") == 1u);
  Pg pg(payments_dsn());
  BOOST_TEST(pg.scalar("SELECT count(*) FROM payment WHERE provider = 'stripe' AND "
                       "external_payment_id = $1",
                       {external_id}) == "1");
  BOOST_TEST(service.child.stop() == 0);
}

BOOST_AUTO_TEST_CASE(spec_C33_invalid_bodies_get_400_problem_naming_the_field) {
  PaymentService& service = shared_service();
  const std::string ext = unique("invalid");
  const std::string long_id(201, 'x');
  struct Case {
    std::string body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {R"({"customer_id":"c","provider":"p","external_payment_id":"e","amount":"1"})", "order_id"},
      {R"({"order_id":"o","provider":"p","external_payment_id":"e","amount":"1"})", "customer_id"},
      {R"({"order_id":"o","customer_id":"c","external_payment_id":"e","amount":"1"})", "provider"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","amount":"1"})", "external_payment_id"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":"e"})", "amount"},
      {R"({"order_id":"","customer_id":"c","provider":"p","external_payment_id":"e","amount":"1"})",
       "order_id"},
      {R"({"order_id":"o","customer_id":7,"provider":"p","external_payment_id":"e","amount":"1"})",
       "customer_id"},
      {R"({"order_id":"o","customer_id":"c","provider":null,"external_payment_id":"e","amount":"1"})",
       "provider"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":")" + long_id +
           R"(","amount":"1"})",
       "external_payment_id"},
      {R"({"order_id":"o","customer_id":"c","provider":"p","external_payment_id":"a\u0000b","amount":"1"})",
       "external_payment_id"},
      {payment_body("p", ext, "\"10.12345\""), "amount"},
      {payment_body("p", ext, "10.12345"), "amount"},
      {payment_body("p", ext, "\"-1\""), "amount"},
      {payment_body("p", ext, "-1"), "amount"},
      {payment_body("p", ext, "0"), "amount"},
      {payment_body("p", ext, "\"0.0000\""), "amount"},
      {payment_body("p", ext, "1e3"), "amount"},
      {payment_body("p", ext, "\"1e3\""), "amount"},
      {payment_body("p", ext, "\" 10\""), "amount"},
      {payment_body("p", ext, "\"010\""), "amount"},
      {payment_body("p", ext, "\"10.\""), "amount"},
      {payment_body("p", ext, "1234567890123456"), "amount"},
      {payment_body("p", ext, "true"), "amount"},
      {payment_body("p", ext, "[1]"), "amount"},
      {R"({"order_id":"o","order_id":"o2","customer_id":"c","provider":"p","external_payment_id":"e","amount":"1"})",
       "order_id"},
      {"not json", "JSON"},
      {"[]", "object"},
      {"", "JSON"},
  };
  const json::object before = service.stats();
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT("body: " << c.body) {
      require_problem(service.post("/payments", c.body), 400, c.field);
    }
  }
  const json::object after = service.stats();
  BOOST_TEST(counter(after, "payment_posts") - counter(before, "payment_posts") == cases.size());
  BOOST_TEST(counter(after, "payments_inserted") == counter(before, "payments_inserted"));
  Pg pg(payments_dsn());
  BOOST_TEST(pg.scalar("SELECT count(*) FROM payment WHERE external_payment_id = $1", {ext}) ==
             "0");
}

BOOST_AUTO_TEST_CASE(amounts_are_stored_exactly_as_numeric_19_4) {
  PaymentService& service = shared_service();
  Pg pg(payments_dsn());
  // The last two lose digits in a double: 999999999999999.9999 becomes 1e15.
  const std::vector<std::pair<std::string, std::string>> amounts = {
      {"\"10.1234\"", "10.1234"},
      {"10.1234", "10.1234"},
      {"\"0.0001\"", "0.0001"},
      {"7", "7.0000"},
      {"\"999999999999999.9999\"", "999999999999999.9999"},
      {"999999999999999.9999", "999999999999999.9999"},
  };
  for (const auto& [literal, stored] : amounts) {
    BOOST_TEST_CONTEXT("amount " << literal) {
      const std::string ext = unique("amount");
      const HttpResponse res = service.post("/payments", payment_body("stripe", ext, literal));
      BOOST_TEST_REQUIRE(res.status == 201u, res.body);
      const json::object payment = json::parse(res.body).as_object();
      BOOST_TEST(payment.at("amount").as_string() == stored);

      const std::string id = std::to_string(payment.at("id").as_int64());
      const HttpResponse read_back = service.get("/payments/" + id);
      BOOST_TEST_REQUIRE(read_back.status == 200u, read_back.body);
      BOOST_TEST(json::parse(read_back.body).at("amount").as_string() == stored);
      BOOST_TEST(pg.scalar("SELECT amount::text FROM payment WHERE id = $1", {id}) == stored);
    }
  }
}

BOOST_AUTO_TEST_CASE(refund_happens_once_then_conflicts) {
  PaymentService& service = shared_service();
  const json::object before = service.stats();
  const HttpResponse created =
      service.post("/payments", payment_body("stripe", unique("refund"), "\"25.00\""));
  BOOST_TEST_REQUIRE(created.status == 201u, created.body);
  const std::string id = std::to_string(json::parse(created.body).at("id").as_int64());

  const HttpResponse refunded = service.post("/payments/" + id + "/refund", "");
  BOOST_TEST_REQUIRE(refunded.status == 200u, refunded.body);
  const json::object payment = json::parse(refunded.body).as_object();
  BOOST_TEST(payment.at("status").as_string() == "refunded");
  BOOST_TEST(payment.at("refunded_at").is_string());

  require_problem(service.post("/payments/" + id + "/refund", ""), 409, id);
  const HttpResponse read_back = service.get("/payments/" + id);
  BOOST_TEST(json::parse(read_back.body).at("status").as_string() == "refunded");

  require_problem(service.post("/payments/999999999999/refund", ""), 404, "999999999999");
  require_problem(service.post("/payments/not-a-number/refund", ""), 404, "not-a-number");
  require_problem(service.get("/payments/999999999999"), 404, "999999999999");

  const json::object after = service.stats();
  BOOST_TEST(counter(after, "refunds") - counter(before, "refunds") == 4u);
  BOOST_TEST(counter(after, "refunds_applied") - counter(before, "refunds_applied") == 1u);
}

BOOST_AUTO_TEST_CASE(events_are_processed_once_per_event_id) {
  PaymentService& service = shared_service();
  const json::object before = service.stats();
  const std::string event_id = unique("event");
  const std::string topic = unique("topic");
  const std::string body = R"({"event_id":")" + event_id + R"(","topic":")" + topic + R"("})";

  const HttpResponse first = service.post("/events", body);
  BOOST_TEST_REQUIRE(first.status == 200u, first.body);
  BOOST_TEST(json::parse(first.body).at("status").as_string() == "processed");
  const HttpResponse again = service.post("/events", body);
  BOOST_TEST_REQUIRE(again.status == 200u, again.body);
  BOOST_TEST(json::parse(again.body).at("status").as_string() == "duplicate");
  require_problem(service.post("/events", R"({"topic":"t"})"), 400, "event_id");

  const json::object after = service.stats();
  BOOST_TEST(counter(after, "events") - counter(before, "events") == 3u);
  BOOST_TEST(counter(after, "events_recorded") - counter(before, "events_recorded") == 1u);
  Pg pg(payments_dsn());
  BOOST_TEST(pg.scalar("SELECT deliveries FROM event_tally WHERE topic = $1", {topic}) == "1");
  BOOST_TEST(pg.scalar("SELECT expires_at > now() + interval '71 hours' FROM processed_event "
                       "WHERE event_id = $1",
                       {event_id}) == "t");
}

BOOST_AUTO_TEST_CASE(unknown_paths_get_404_and_wrong_methods_405_with_allow) {
  PaymentService& service = shared_service();
  require_problem(service.get("/nowhere"), 404, "/nowhere");
  require_problem(service.get("/payments/1/refund/extra"), 404, "/payments/1/refund/extra");

  const HttpResponse get_collection = service.get("/payments");
  require_problem(get_collection, 405, "POST");
  BOOST_TEST(get_collection.header("Allow").value_or("") == "POST");
  const HttpResponse delete_one = service.send({"DELETE", "/payments/1", {}, ""});
  require_problem(delete_one, 405, "GET");
  BOOST_TEST(delete_one.header("Allow").value_or("") == "GET");
  require_problem(service.post("/stats", "{}"), 405, "GET");
  require_problem(service.get("/events"), 405, "POST");

  const HttpResponse health = service.get("/healthz");
  BOOST_TEST(health.status == 200u);
  BOOST_TEST(health.header("Content-Length").value_or("") == std::to_string(health.body.size()));
  const json::object stats = service.stats();
  for (const char* name : {"payment_posts", "payments_inserted", "refunds", "events"})
    BOOST_TEST(stats.contains(name), name);
}

BOOST_AUTO_TEST_CASE(keep_alive_serves_many_requests_and_closes_idle_connections) {
  PaymentService service({"--keep-alive-timeout", "1"});
  service.await_ready();
  HttpConnection connection(kHost, service.port);
  for (int i = 0; i < 5; ++i) {
    const HttpResponse res =
        connection.request({"POST", "/payments", {}, payment_body("stripe", unique("keepalive"))});
    BOOST_TEST_REQUIRE(res.status == 201u, res.body);
    BOOST_TEST(res.keep_alive);
    BOOST_TEST(res.header("Keep-Alive").value_or("") == "timeout=1");
  }
  BOOST_TEST(counter(service.stats(), "payments_inserted") == 5u);
  // The advertised idle timeout is kept: the server ends the connection without a request.
  BOOST_TEST(connection.wait_closed_by_peer());

  // HTTP/1.0 without keep-alive gets its answer and the connection closes.
  HttpConnection old_client(kHost, service.port);
  const HttpResponse res = old_client.request({"GET", "/healthz", {}, "", 10});
  BOOST_TEST(res.status == 200u);
  BOOST_TEST(!res.keep_alive);
  BOOST_TEST(!old_client.is_open());
}

BOOST_AUTO_TEST_CASE(instances_starting_together_create_the_schema_once) {
  // An empty schema of our own, reached through search_path in the DSN.
  const std::string schema =
      "pt_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}() % 1000000);
  Pg pg(payments_dsn());
  pg.scalar("CREATE SCHEMA " + schema);
  const std::string base = payments_dsn();
  const std::string dsn = base + (base.find('?') == std::string::npos ? "?" : "&") +
                          "options=-csearch_path%3D" + schema;

  std::vector<std::unique_ptr<PaymentService>> services;
  for (int i = 0; i < 3; ++i)
    services.push_back(std::make_unique<PaymentService>(std::vector<std::string>{}, dsn));
  for (auto& s : services) s->await_ready();

  BOOST_TEST(pg.scalar("SELECT count(*) FROM pg_tables WHERE schemaname = $1", {schema}) == "3");
  const std::string body = payment_body("stripe", "same-everywhere");
  std::multiset<unsigned> statuses;
  for (auto& s : services) statuses.insert(s->post("/payments", body).status);
  BOOST_TEST((statuses == std::multiset<unsigned>{200u, 200u, 201u}));
  BOOST_TEST(pg.scalar("SELECT count(*) FROM " + schema + ".payment") == "1");

  for (auto& s : services) BOOST_TEST(s->child.stop() == 0);
  pg.scalar("DROP SCHEMA " + schema + " CASCADE");
}

BOOST_AUTO_TEST_CASE(sigterm_exits_0_and_every_stderr_line_is_json) {
  PaymentService service;
  service.await_ready();
  BOOST_TEST(service.post("/payments", payment_body("stripe", unique("log"))).status == 201u);
  BOOST_TEST(service.child.stop() == 0);

  std::istringstream lines(service.log());
  std::string line;
  std::set<std::string> messages;
  while (std::getline(lines, line)) {
    BOOST_TEST_CONTEXT("line: " << line) {
      json::error_code ec;
      const json::value v = json::parse(line, ec);
      BOOST_TEST_REQUIRE(!ec);
      BOOST_TEST_REQUIRE(v.is_object());
      BOOST_TEST(v.as_object().contains("time"));
      messages.insert(std::string(v.at("msg").as_string()));
    }
  }
  for (const char* expected : {"listening", "request", "stopping", "stopped"})
    BOOST_TEST(messages.count(expected) == 1u, expected);
}

BOOST_AUTO_TEST_CASE(sigterm_lets_an_in_flight_post_finish_then_exits_0) {
  PaymentService service({"--delay-ms", "1000"});
  service.await_ready();
  const std::string body = payment_body("stripe", unique("drain"));
  HttpConnection in_flight(kHost, service.port);
  in_flight.send_raw(
      "POST /payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  // The service counts the POST before its delay: once counted, the request is in flight.
  const auto deadline = std::chrono::steady_clock::now() + kEventDeadline;
  while (counter(service.stats(), "payment_posts") == 0) {
    BOOST_TEST_REQUIRE((std::chrono::steady_clock::now() < deadline));
    std::this_thread::yield();
  }
  service.child.signal(SIGTERM);

  const HttpResponse res = in_flight.read_response();
  BOOST_TEST(res.status == 201u, res.body);
  BOOST_TEST(!res.keep_alive);
  BOOST_TEST(service.child.wait_for(kEventDeadline).value_or(-1) == 0);
}

BOOST_AUTO_TEST_CASE(bad_arguments_exit_2_and_unreachable_database_exits_1) {
  ChildOptions missing_dsn;
  missing_dsn.executable = binary();
  missing_dsn.args = {"--listen", "127.0.0.1:0"};
  missing_dsn.stderr_path = "/dev/null";
  ChildProcess bad_args(missing_dsn);
  BOOST_TEST(bad_args.wait_for(kEventDeadline).value_or(-1) == 2);

  ChildOptions no_database = missing_dsn;
  no_database.args = {"--listen", "127.0.0.1:0", "--dsn",
                      "postgresql://idem@127.0.0.1:" + std::to_string(idemgate::test::free_port()) +
                          "/payments?connect_timeout=5"};
  ChildProcess unreachable(no_database);
  BOOST_TEST(unreachable.wait_for(kEventDeadline).value_or(-1) == 1);
}
