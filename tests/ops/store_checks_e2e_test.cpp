// The stores are checked, not trusted (SPEC C58): Redis maxmemory-policy, Postgres
// synchronous_commit and the schema version, at start, on SIGHUP, in `check-config --stores`
// and in /readyz's body, and /readyz saying `degraded` while a fail_open route forwards
// unprotected. Runs on stores of its own (scripts/local-stores), whose settings the tests change.
#define BOOST_TEST_MODULE store_checks_e2e
#include <hiredis/hiredis.h>
#include <stdlib.h>

#include <boost/json/parse.hpp>
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <thread>

#include "tests/ops/ops_support.hpp"

namespace idemgate::test::ops {
namespace {

namespace json = boost::json;

/// Private stores, which the fixture's variables point at (LocalStores exports them).
struct Stores : LocalStores {
  /// The same server as the superuser (local-stores trusts loopback), for settings and rows
  /// the gateway's role may not change.
  std::string superuser_dsn() const {
    std::string dsn = pg_dsn();
    dsn.replace(dsn.find("idem@"), 5, "postgres@");
    return dsn;
  }
  /// Runs a Redis command on the private Redis; its reply as text.
  std::string redis(const std::string& command) const {
    const auto colon = redis_address().rfind(':');
    redisContext* c = redisConnect(redis_address().substr(0, colon).c_str(),
                                   std::stoi(redis_address().substr(colon + 1)));
    BOOST_TEST_REQUIRE((c != nullptr && c->err == 0), "cannot connect to the private Redis");
    auto* reply = static_cast<redisReply*>(redisCommand(c, command.c_str()));
    std::string text = reply && reply->str ? std::string(reply->str, reply->len) : "";
    freeReplyObject(reply);
    redisFree(c);
    return text;
  }
};

std::string gateway_yaml(const e2e::TestUpstream& upstream, const std::string& redis_extra = "",
                         const std::string& idempotency_extra = "") {
  e2e::GatewayConfig config;
  config.upstreams = {e2e::UpstreamConfig{"up", {upstream.address()}}};
  e2e::RouteConfig route;
  route.name = "pay";
  route.path_prefix = "/";
  route.upstream = "up";
  route.mode = "required";
  if (!idempotency_extra.empty()) route.extra = {idempotency_extra};
  config.routes = {route};
  if (!redis_extra.empty()) {
    const auto& address = std::string(std::getenv("IDEMGATE_REDIS_ADDR"));
    const auto colon = address.rfind(':');
    config.redis = "address: " + address.substr(0, colon) + ", port: " + address.substr(colon + 1) +
                   ", " + redis_extra;
  }
  return config.render();
}

/// What an idemgate command line ended with.
struct Run {
  int status = -1;
  std::string out;
  std::string err;
};

/// Runs `idemgate ARGS…` (CONFIG stands for a file holding `yaml`) to its end.
Run run_idemgate(const std::string& yaml, std::vector<std::string> args) {
  e2e::TempDir dir;
  const std::string config = (dir.path() / "gateway.yaml").string();
  std::ofstream(config) << yaml;
  for (auto& a : args) {
    if (a == "CONFIG") a = config;
  }
  ChildOptions o;
  o.executable = require_env("IDEMGATE_BINARY_DIR") + "/gateway/idemgate";
  o.args = std::move(args);
  o.stdout_path = (dir.path() / "out").string();
  o.stderr_path = (dir.path() / "err").string();
  ChildProcess child(o);
  Run run;
  const auto status = child.wait_for(e2e::kEventDeadline);
  run.status = status ? *status : child.stop();
  run.out = read_text_file(o.stdout_path);
  run.err = read_text_file(o.stderr_path);
  return run;
}

/// Everything the gateway logged so far.
std::string log_text(const OpsGateway& gateway) {
  return read_text_file((gateway.dir() / "idemgate.log").string());
}

/// The check named `name` in a /readyz body, or an empty object.
json::object check_in(const HttpResponse& readyz, const std::string& name) {
  const json::value body = json::parse(readyz.body);
  for (const auto& c : body.at("checks").as_array()) {
    if (c.at("name").as_string() == name) return c.as_object();
  }
  return {};
}

std::string verdict_of(const HttpResponse& readyz, const std::string& name) {
  const auto check = check_in(readyz, name);
  return check.contains("verdict") ? std::string(check.at("verdict").as_string()) : "missing";
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C58_an_allkeys_policy_refuses_start_unless_allow_eviction) {
  Stores stores;
  e2e::TestUpstream upstream;
  BOOST_TEST_REQUIRE(stores.redis("CONFIG SET maxmemory-policy allkeys-lru") == "OK");

  const Run refused = run_idemgate(gateway_yaml(upstream), {"--config", "CONFIG"});
  BOOST_TEST(refused.status == 1, refused.err);
  BOOST_TEST(refused.err.find("maxmemory-policy is allkeys-lru") != std::string::npos, refused.err);
  BOOST_TEST(refused.err.find("storage.redis.allow_eviction") != std::string::npos, refused.err);
  BOOST_TEST(refused.err.find("\"msg\":\"listening\"") == std::string::npos, refused.err);

  OpsGateway gateway(gateway_yaml(upstream, "allow_eviction: true"));
  const HttpResponse ready = gateway.admin_get("/readyz");
  BOOST_TEST(ready.status == 200u, e2e::describe(ready));
  BOOST_TEST(verdict_of(ready, "redis maxmemory-policy") == "warning", ready.body);
  BOOST_TEST(gateway.log_count("store check") >= 3u, gateway.stderr_tail());
}

BOOST_AUTO_TEST_CASE(spec_C58_synchronous_commit_off_is_a_warning_and_the_gateway_serves) {
  Stores stores;
  e2e::Database admin(stores.superuser_dsn());
  admin.scalar("ALTER DATABASE idem SET synchronous_commit = off");
  e2e::TestUpstream upstream;

  OpsGateway gateway(gateway_yaml(upstream));
  BOOST_TEST(log_text(gateway).find("synchronous_commit is off") != std::string::npos,
             gateway.stderr_tail());
  const HttpResponse ready = gateway.admin_get("/readyz");
  BOOST_TEST(ready.status == 200u, e2e::describe(ready));
  const json::value body = json::parse(ready.body);
  BOOST_TEST(body.at("status").as_string() == "ready");
  BOOST_TEST(verdict_of(ready, "postgres synchronous_commit") == "warning", ready.body);
  BOOST_TEST(verdict_of(ready, "redis maxmemory-policy") == "ok", ready.body);
  BOOST_TEST(verdict_of(ready, "postgres schema version") == "ok", ready.body);
  BOOST_TEST(body.at("stores").as_array().size() == 2u, ready.body);
  const auto res = gateway.send(e2e::keyed_post("/pay", e2e::unique_name("c58"), "{}"));
  BOOST_TEST(res.status == 201u, e2e::describe(res));

  // SIGHUP checks again; a failure then is logged and the gateway keeps serving.
  BOOST_TEST_REQUIRE(stores.redis("CONFIG SET maxmemory-policy allkeys-random") == "OK");
  const std::size_t before = gateway.log_count("store check");
  gateway.signal(SIGHUP);
  BOOST_TEST(gateway.wait_for_log("store check", before + 3), gateway.stderr_tail());
  BOOST_TEST(log_text(gateway).find("maxmemory-policy is allkeys-random") != std::string::npos,
             gateway.stderr_tail());
  BOOST_TEST(gateway.running());
  const auto after = gateway.send(e2e::keyed_post("/pay", e2e::unique_name("c58"), "{}"));
  BOOST_TEST(after.status == 201u, e2e::describe(after));
  BOOST_TEST(verdict_of(gateway.admin_get("/readyz"), "redis maxmemory-policy") == "failed");
}

BOOST_AUTO_TEST_CASE(spec_C58_a_newer_schema_refuses_start_and_an_older_one_asks_for_migrate) {
  Stores stores;
  e2e::TestUpstream upstream;
  const std::string yaml = gateway_yaml(upstream);
  const Run migrated = run_idemgate(yaml, {"migrate", "--config", "CONFIG"});
  BOOST_TEST_REQUIRE(migrated.status == 0, migrated.err);

  e2e::Database admin(stores.superuser_dsn());
  admin.scalar("INSERT INTO schema_migrations (version) VALUES (9999)");
  const Run newer = run_idemgate(yaml, {"--config", "CONFIG"});
  BOOST_TEST(newer.status == 1, newer.err);
  BOOST_TEST(newer.err.find("newer than this idemgate knows") != std::string::npos, newer.err);

  admin.scalar("DELETE FROM schema_migrations");
  const Run older = run_idemgate(yaml, {"--config", "CONFIG", "--no-migrate"});
  BOOST_TEST(older.status == 1, older.err);
  BOOST_TEST(older.err.find("run idemgate migrate") != std::string::npos, older.err);
}

BOOST_AUTO_TEST_CASE(spec_C58_check_config_stores_prints_every_check_with_its_verdict) {
  Stores stores;
  e2e::TestUpstream upstream;
  const std::string yaml = gateway_yaml(upstream);
  BOOST_TEST_REQUIRE(run_idemgate(yaml, {"migrate", "--config", "CONFIG"}).status == 0);

  const Run good = run_idemgate(yaml, {"check-config", "--stores", "CONFIG"});
  BOOST_TEST(good.status == 0, good.out << good.err);
  for (const char* line : {"postgres: ok\n", "redis: ok\n", "redis maxmemory-policy: ok: ",
                           "postgres synchronous_commit: ok: ", "postgres schema version: ok: "}) {
    BOOST_TEST(good.out.find(line) != std::string::npos, line << " in\n" << good.out);
  }

  e2e::Database admin(stores.superuser_dsn());
  admin.scalar("ALTER DATABASE idem SET synchronous_commit = off");
  const Run warned = run_idemgate(yaml, {"check-config", "--stores", "CONFIG"});
  BOOST_TEST(warned.status == 0, warned.out << warned.err);
  BOOST_TEST(warned.out.find("postgres synchronous_commit: warning: ") != std::string::npos,
             warned.out);

  BOOST_TEST_REQUIRE(stores.redis("CONFIG SET maxmemory-policy allkeys-lfu") == "OK");
  const Run failed = run_idemgate(yaml, {"check-config", "--stores", "CONFIG"});
  BOOST_TEST(failed.status == 1, failed.out << failed.err);
  BOOST_TEST(failed.out.find("redis maxmemory-policy: failed: ") != std::string::npos, failed.out);

  // A Redis that refuses CONFIG: the check could not run, which is a warning, not a failure.
  BOOST_TEST_REQUIRE(stores.redis("CONFIG SET maxmemory-policy noeviction") == "OK");
  BOOST_TEST_REQUIRE(stores.redis("ACL SETUSER default -config") == "OK");
  const Run refused = run_idemgate(yaml, {"check-config", "--stores", "CONFIG"});
  BOOST_TEST(refused.status == 0, refused.out << refused.err);
  BOOST_TEST(
      refused.out.find("redis maxmemory-policy: warning: could not run") != std::string::npos,
      refused.out);
}

BOOST_AUTO_TEST_CASE(spec_C58_readyz_says_degraded_after_a_fail_open_route_forwarded_unprotected) {
  Stores stores;
  e2e::TestUpstream upstream;
  OpsGateway gateway(gateway_yaml(upstream, "", "on_store_error: fail_open"));
  BOOST_TEST(json::parse(gateway.admin_get("/readyz").body).at("status").as_string() == "ready");

  stores.stop_redis();
  const auto unprotected = gateway.send(e2e::keyed_post("/pay", e2e::unique_name("c58"), "{}"));
  BOOST_TEST_REQUIRE(unprotected.header("Idempotency-Status").value_or("") == "unprotected",
                     e2e::describe(unprotected));
  stores.start_redis();
  // C58: "one in the last 10 s" — the stores answer again, the body says degraded until the
  // window has passed since that request.
  std::string status;
  const auto deadline = std::chrono::steady_clock::now() + e2e::kEventDeadline;
  HttpResponse res;
  do {
    res = gateway.admin_get("/readyz");
    status = json::parse(res.body).at("status").as_string().c_str();
    if (status == "degraded") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  BOOST_TEST(status == "degraded", res.body);
  BOOST_TEST(res.status == 200u, e2e::describe(res));
  // Without further unprotected requests it turns back to ready.
  do {
    res = gateway.admin_get("/readyz");
    status = json::parse(res.body).at("status").as_string().c_str();
    if (status == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < deadline + std::chrono::seconds(15));
  BOOST_TEST(status == "ready", res.body);
}

}  // namespace idemgate::test::ops
