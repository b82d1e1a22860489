#include "tests/support/answers.hpp"

#include <exception>
#include <iostream>

namespace idemgate::test {

Timed timed_request(std::uint16_t port, const HttpRequest& request,
                    std::chrono::milliseconds timeout) {
  Timed t;
  t.start = Clock::now();
  try {
    t.response = http_request(e2e::kLoopback, port, request, timeout);
  } catch (const std::exception& e) {
    t.error = e.what();
  }
  t.done = Clock::now();
  return t;
}

Timed send_timed(const e2e::Gateway& gateway, const HttpRequest& request, int instance) {
  Timed t = timed_request(gateway.port(instance), request);
  t.instance = instance;
  return t;
}

Timed send_until_not_503(const e2e::Gateway& gateway, const HttpRequest& request, int instance,
                         std::chrono::milliseconds interval, std::map<std::string, int>* kinds) {
  Timed last;
  eventually(
      [&] {
        last = send_timed(gateway, request, instance);
        const std::string kind = kind_of(last);
        if (kinds) ++(*kinds)[kind];
        return kind != "503";
      },
      interval);
  return last;
}

bool replayed(const HttpResponse& r) {
  return r.header("Idempotent-Replayed").value_or("") == "true";
}

bool success(const HttpResponse& r) {
  return r.status == 200 || r.status == 201;
}

bool executed(const HttpResponse& r) {
  return success(r) && !replayed(r) && !r.header("Idempotency-Status").has_value();
}

bool in_flight(const HttpResponse& r) {
  return e2e::is_problem(r, 409) &&
         e2e::problem_type(r) == kGatewayProblems + "request-in-flight" &&
         r.header("Retry-After").has_value();
}

bool store_unavailable(const HttpResponse& r) {
  return e2e::is_problem(r, 503) &&
         e2e::problem_type(r) == kGatewayProblems + "store-unavailable" &&
         r.header("Retry-After").has_value();
}

std::string kind_of(const Timed& t) {
  if (!t.answered()) return "no-answer";
  if (executed(t.response)) return "executed";
  if (success(t.response) && replayed(t.response)) return "replayed";
  if (in_flight(t.response)) return "409";
  if (store_unavailable(t.response)) return "503";
  return "other-" + std::to_string(t.response.status);
}

bool allowed_kind(const std::string& kind) {
  return kind == "executed" || kind == "replayed" || kind == "409" || kind == "503";
}

std::string summary(const std::map<std::string, int>& kinds) {
  std::string out;
  for (const auto& [kind, n] : kinds)
    out += (out.empty() ? "" : " ") + kind + "=" + std::to_string(n);
  return out;
}

std::int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

void report(const std::string& scenario, std::uint64_t executions, std::uint64_t distinct_keys) {
  std::cout << "scenario=" << scenario << " executions=" << executions
            << " distinct_keys=" << distinct_keys << std::endl;
}

}  // namespace idemgate::test
