// /readyz follows the stores (SPEC C30): 503 naming Redis while it is down, 200 again once it is
// back, without a gateway restart; so does the `idemgate_ready` gauge of /metrics (C31). Runs on
// stores of its own (scripts/local-stores), so stopping Postgres or Redis here disturbs no other
// suite; this executable points the fixture's variables at them.
#define BOOST_TEST_MODULE ops_readiness_e2e
#include <boost/test/unit_test.hpp>

#include "tests/ops/ops_support.hpp"

namespace idemgate::test::ops {
namespace {

// Readiness has no push notification: ask until it says `status` (or the deadline passes).
HttpResponse wait_for_readiness(const OpsGateway& gateway, unsigned status) {
  HttpResponse res;
  eventually(
      [&] {
        res = gateway.admin_get("/readyz");
        return res.status == status;
      },
      std::chrono::milliseconds(20));
  return res;
}

// The value of idemgate_ready in a scrape of the admin /metrics, or -1 when it is missing.
double scraped_ready(const OpsGateway& gateway) {
  const auto res = gateway.admin_get("/metrics");
  BOOST_TEST_REQUIRE(res.status == 200u, e2e::describe(res));
  return metric_value(res.body, "idemgate_ready").value_or(-1);
}

// Scrapes until idemgate_ready is `value` (a store's stop or return is noticed by the next check
// that meets it) or the deadline passes; the last value read.
double wait_for_scraped_ready(const OpsGateway& gateway, double value) {
  double ready = -1;
  eventually(
      [&] {
        ready = scraped_ready(gateway);
        return ready == value;
      },
      std::chrono::milliseconds(20));
  return ready;
}

// One keyed route to `upstream`, on the stores the fixture's variables name.
std::string gateway_yaml(const e2e::TestUpstream& upstream) {
  e2e::GatewayConfig config;
  config.upstreams = {e2e::UpstreamConfig{"up", {upstream.address()}}};
  e2e::RouteConfig route;
  route.name = "pay";
  route.path_prefix = "/";
  route.upstream = "up";
  route.mode = "required";
  config.routes = {route};
  return config.render();
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C31_idemgate_ready_follows_the_stores_at_each_scrape) {
  LocalStores stores;  // the fixture's variables now point at these

  e2e::TestUpstream upstream;
  OpsGateway gateway(gateway_yaml(upstream));

  // Each scrape checks readiness itself: no /readyz request is made in this test.
  BOOST_TEST(scraped_ready(gateway) == 1.0);
  stores.stop_pg();
  BOOST_TEST(wait_for_scraped_ready(gateway, 0.0) == 0.0);
  stores.start_pg();
  BOOST_TEST(wait_for_scraped_ready(gateway, 1.0) == 1.0);
  stores.stop_redis();
  BOOST_TEST(wait_for_scraped_ready(gateway, 0.0) == 0.0);
  stores.start_redis();
  BOOST_TEST(wait_for_scraped_ready(gateway, 1.0) == 1.0);
}

BOOST_AUTO_TEST_CASE(spec_C30_readyz_is_503_naming_redis_while_it_is_down_and_200_once_back) {
  LocalStores stores;  // the fixture's variables now point at these

  e2e::TestUpstream upstream;
  OpsGateway gateway(gateway_yaml(upstream));

  const auto up = gateway.admin_get("/readyz");
  BOOST_TEST(up.status == 200u, e2e::describe(up));

  stores.stop_redis();
  const auto down = wait_for_readiness(gateway, 503);
  BOOST_TEST(down.status == 503u, e2e::describe(down));
  BOOST_TEST(down.body.find(R"("failing":["redis"])") != std::string::npos, down.body);
  BOOST_TEST(down.header("Content-Type").value_or("") == "application/json");
  BOOST_TEST(gateway.admin_get("/healthz").status == 200u);
  // The request path agrees: a keyed request cannot be protected now (C25).
  BOOST_TEST(
      e2e::is_problem(gateway.send(e2e::keyed_post("/pay", e2e::unique_name("ready"), "{}")), 503));

  stores.start_redis();
  const auto back = wait_for_readiness(gateway, 200);
  BOOST_TEST(back.status == 200u, e2e::describe(back));
  BOOST_TEST(back.body.find(R"("redis":"ok")") != std::string::npos, back.body);
}

}  // namespace idemgate::test::ops
