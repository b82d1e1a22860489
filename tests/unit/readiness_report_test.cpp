#define BOOST_TEST_MODULE readiness_report
#include <boost/json/serialize.hpp>
#include <boost/test/unit_test.hpp>

#include "gateway/admin/readiness_report.hpp"

// The one report /readyz, check-config --stores and the logs render (SPEC C30, C58).

using idemgate::admin::ReadinessReport;
using Verdict = idemgate::core::StoreCheck::Verdict;

namespace {

ReadinessReport sample() {
  ReadinessReport r;
  r.stores = {{"postgres", ""}, {"redis", ""}};
  r.checks = {{"redis maxmemory-policy", Verdict::ok, "maxmemory-policy is noeviction"},
              {"postgres synchronous_commit", Verdict::warning, "synchronous_commit is off"}};
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C58_status_is_ready_degraded_unavailable_or_draining) {
  ReadinessReport r = sample();
  BOOST_TEST(r.status() == "ready");
  r.degraded = true;
  BOOST_TEST(r.status() == "degraded");
  r.stores[1].error = "connection refused";
  BOOST_TEST(r.status() == "unavailable");
  r.draining = true;
  BOOST_TEST(r.status() == "draining");
}

BOOST_AUTO_TEST_CASE(spec_C58_a_warning_is_not_a_failure_and_a_failed_check_is) {
  ReadinessReport r = sample();
  BOOST_TEST(!r.any_check_failed());
  r.checks.push_back({"postgres schema version", Verdict::failed, "run idemgate migrate"});
  BOOST_TEST(r.any_check_failed());
}

BOOST_AUTO_TEST_CASE(spec_C58_json_lists_each_store_and_each_check_with_its_verdict) {
  ReadinessReport r = sample();
  r.stores[1].error = "connection refused";
  const std::string json = boost::json::serialize(r.to_json());
  BOOST_TEST(json.find(R"("status":"unavailable")") != std::string::npos, json);
  BOOST_TEST(json.find(R"("failing":["redis"])") != std::string::npos, json);
  BOOST_TEST(json.find(R"("redis":"connection refused")") != std::string::npos, json);
  BOOST_TEST(json.find(R"({"name":"redis","state":"failed","detail":"connection refused"})") !=
                 std::string::npos,
             json);
  BOOST_TEST(json.find(R"({"name":"postgres synchronous_commit","verdict":"warning",)") !=
                 std::string::npos,
             json);
}

BOOST_AUTO_TEST_CASE(spec_C58_text_has_one_line_per_store_and_check) {
  BOOST_TEST(sample().to_text() ==
             "postgres: ok\n"
             "redis: ok\n"
             "redis maxmemory-policy: ok: maxmemory-policy is noeviction\n"
             "postgres synchronous_commit: warning: synchronous_commit is off\n");
}
