// Request ids and W3C traceparent (conf/REFERENCE.md, "request_id"): which received ids are
// kept, what a generated one looks like, how the request field is made to agree, and which
// traceparent values yield a trace id for the access line.
#define BOOST_TEST_MODULE request_id
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gateway/http/request_id.hpp"
#include "gateway/http/traceparent.hpp"

namespace http = idemgate::http;

namespace {

bool is_uuid_v4(const std::string& s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (s[i] == '-')) return false;
    if (!dash && !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  }
  return s[14] == '4' && std::string("89ab").find(s[19]) != std::string::npos;
}

std::string generated() {
  char out[http::kGeneratedRequestIdBytes];
  http::generate_request_id(out);
  return std::string(out, sizeof out);
}

std::vector<std::string> values(const boost::beast::http::fields& f, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& field : f) {
    if (boost::beast::iequals(field.name_string(), name)) out.emplace_back(field.value());
  }
  return out;
}

const std::string kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

}  // namespace

// ---------------------------------------------------------------------------------------------
// Validation of received ids

BOOST_AUTO_TEST_CASE(request_id_of_visible_ascii_up_to_200_bytes_is_valid) {
  BOOST_TEST(http::valid_request_id("a"));
  BOOST_TEST(http::valid_request_id("0f8fad5b-d9cb-469f-a165-70867728950e"));
  BOOST_TEST(http::valid_request_id("req_!#$%&'*+-.^_`|~:;<=>?@[]{}\"(),/\\"));
  BOOST_TEST(http::valid_request_id(std::string(200, 'x')));
}

BOOST_AUTO_TEST_CASE(request_id_empty_too_long_or_with_other_bytes_is_invalid) {
  BOOST_TEST(!http::valid_request_id(""));
  BOOST_TEST(!http::valid_request_id(std::string(201, 'x')));
  BOOST_TEST(!http::valid_request_id("with space"));
  BOOST_TEST(!http::valid_request_id("tab\there"));
  BOOST_TEST(!http::valid_request_id("caf\xc3\xa9"));  // UTF-8 é: obs-text
  BOOST_TEST(!http::valid_request_id("del\x7f"));
  BOOST_TEST(!http::valid_request_id(std::string("nul\0x", 5)));
}

// ---------------------------------------------------------------------------------------------
// Generated ids

BOOST_AUTO_TEST_CASE(generated_request_id_is_a_lower_case_uuid_v4) {
  for (int i = 0; i < 1000; ++i) {
    const auto id = generated();
    BOOST_TEST_REQUIRE(is_uuid_v4(id), id);
    BOOST_TEST_REQUIRE(http::valid_request_id(id));
  }
}

BOOST_AUTO_TEST_CASE(generated_request_ids_differ_across_calls_and_threads) {
  // Past the 256 ids of one refill of a thread's random bytes, on four threads at once.
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ids, t] {
      for (int i = 0; i < kPerThread; ++i) ids[t].push_back(generated());
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<std::string> all;
  for (const auto& list : ids) all.insert(list.begin(), list.end());
  BOOST_TEST(all.size() == static_cast<std::size_t>(kThreads * kPerThread));
}

BOOST_AUTO_TEST_CASE(generating_a_request_id_costs_figures) {
  // Not a bound: the figure goes to the log for comparison between builds.
  constexpr int kIds = 100'000;
  char out[http::kGeneratedRequestIdBytes];
  unsigned char mix = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIds; ++i) {
    http::generate_request_id(out);
    mix = static_cast<unsigned char>(mix ^ static_cast<unsigned char>(out[i % 36]));
  }
  const auto ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("figures scenario=generate_request_id ids="
                     << kIds << " ns_per_id=" << ns / kIds << " mix=" << static_cast<int>(mix));
  BOOST_TEST(is_uuid_v4(std::string(out, sizeof out)));
}

// ---------------------------------------------------------------------------------------------
// apply_request_id: the id of a request and its field

BOOST_AUTO_TEST_CASE(valid_received_request_id_is_kept_and_the_field_untouched) {
  boost::beast::http::fields f;
  f.insert("x-request-id", "client-42");
  std::string storage;
  const auto id = http::apply_request_id(f, http::RequestId{}, storage);
  BOOST_TEST(id == "client-42");
  BOOST_TEST(values(f, "X-Request-Id") == std::vector<std::string>{"client-42"});
}

BOOST_AUTO_TEST_CASE(absent_request_id_is_generated_and_added) {
  boost::beast::http::fields f;
  f.insert("Accept", "*/*");
  std::string storage;
  const std::string id(http::apply_request_id(f, http::RequestId{}, storage));
  BOOST_TEST(is_uuid_v4(id), id);
  BOOST_TEST(values(f, "X-Request-Id") == std::vector<std::string>{id});
  // The next request gets another one; the storage is reused.
  boost::beast::http::fields g;
  BOOST_TEST(http::apply_request_id(g, http::RequestId{}, storage) != id);
}

BOOST_AUTO_TEST_CASE(invalid_or_repeated_request_id_is_replaced_by_a_generated_one) {
  for (const std::vector<std::string>& sent :
       {std::vector<std::string>{std::string(201, 'a')}, std::vector<std::string>{"has space"},
        std::vector<std::string>{""}, std::vector<std::string>{"one", "two"}}) {
    boost::beast::http::fields f;
    for (const auto& v : sent) f.insert("X-Request-Id", v);
    std::string storage;
    const std::string id(http::apply_request_id(f, http::RequestId{}, storage));
    BOOST_TEST(is_uuid_v4(id), id);
    BOOST_TEST(values(f, "X-Request-Id") == std::vector<std::string>{id});
  }
}

BOOST_AUTO_TEST_CASE(without_generate_the_field_is_never_written) {
  http::RequestId cfg;
  cfg.generate = false;
  std::string storage = "left over from the previous request";
  {
    boost::beast::http::fields f;
    BOOST_TEST(http::apply_request_id(f, cfg, storage).empty());
    BOOST_TEST(values(f, "X-Request-Id").empty());
  }
  {
    boost::beast::http::fields f;
    f.insert("X-Request-Id", "has space");  // forwarded as received, but not the request's id
    BOOST_TEST(http::apply_request_id(f, cfg, storage).empty());
    BOOST_TEST(values(f, "X-Request-Id") == std::vector<std::string>{"has space"});
  }
  {
    boost::beast::http::fields f;
    f.insert("X-Request-Id", "client-7");
    BOOST_TEST(http::apply_request_id(f, cfg, storage) == "client-7");
  }
}

BOOST_AUTO_TEST_CASE(configured_header_name_is_used) {
  http::RequestId cfg;
  cfg.header = "X-Correlation-Id";
  boost::beast::http::fields f;
  f.insert("X-Request-Id", "not this one");
  std::string storage;
  const std::string id(http::apply_request_id(f, cfg, storage));
  BOOST_TEST(is_uuid_v4(id), id);
  BOOST_TEST(values(f, "X-Correlation-Id") == std::vector<std::string>{id});
  BOOST_TEST(values(f, "X-Request-Id") == std::vector<std::string>{"not this one"});
}

// ---------------------------------------------------------------------------------------------
// W3C traceparent (Trace Context §3.2)

BOOST_AUTO_TEST_CASE(traceparent_valid_version_00_yields_its_trace_id) {
  BOOST_TEST(http::traceparent_trace_id(kTraceparent) == "4bf92f3577b34da6a3ce929d0e0e4736");
  // Flags are opaque here: unsampled and unknown bits alike.
  BOOST_TEST(
      http::traceparent_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") ==
      "4bf92f3577b34da6a3ce929d0e0e4736");
  BOOST_TEST(
      http::traceparent_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff") ==
      "4bf92f3577b34da6a3ce929d0e0e4736");
}

BOOST_AUTO_TEST_CASE(traceparent_of_a_higher_version_may_carry_more_fields) {
  // §4.3: a later version is read by the version-00 layout; what follows must begin with '-'.
  BOOST_TEST(
      http::traceparent_trace_id("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") ==
      "4bf92f3577b34da6a3ce929d0e0e4736");
  BOOST_TEST(http::traceparent_trace_id(
                 "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds") ==
             "4bf92f3577b34da6a3ce929d0e0e4736");
  BOOST_TEST(http::traceparent_trace_id(
                 "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what") == "");
}

BOOST_AUTO_TEST_CASE(traceparent_malformed_yields_no_trace_id) {
  for (const std::string& bad : {
           std::string(""),
           std::string("00"),
           // version ff is forbidden; versions are hex
           std::string("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           std::string("0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           // all-zero trace id or parent id
           std::string("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
           // upper-case hex is not HEXDIGLC
           std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A"),
           // wrong lengths and separators
           std::string("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e47366-0f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1"),
           std::string("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-"),
           // version 00 has exactly four fields
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"),
           std::string(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\x01"),
       }) {
    BOOST_TEST(http::traceparent_trace_id(bad) == "", "accepted: " << bad);
  }
}

BOOST_AUTO_TEST_CASE(traceparent_request_field_counts_only_when_single) {
  boost::beast::http::fields f;
  BOOST_TEST(http::request_trace_id(f) == "");
  f.insert("TraceParent", kTraceparent);  // field names are case-insensitive
  BOOST_TEST(http::request_trace_id(f) == "4bf92f3577b34da6a3ce929d0e0e4736");
  f.insert("traceparent", "00-11111111111111111111111111111111-2222222222222222-01");
  BOOST_TEST(http::request_trace_id(f) == "", "two traceparent fields are ambiguous");
}
