#pragma once
// What the scale and fault suites send and how they sort the answers: a request with the moments
// it started and ended, the kinds of answer a keyed request can get, and the lines each scenario
// prints.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "tests/e2e/gateway_fixture.hpp"

namespace idemgate::test {

using Clock = std::chrono::steady_clock;

/// The prefix of the gateway's own problem types (gateway/http/problem.cpp); the payment service
/// has types of the same names under its own prefix, which these must not be taken for.
inline const std::string kGatewayProblems = "https://idemgate.dev/problems/";

/// A response, or the client's error, and when the exchange started and ended.
struct Timed {
  HttpResponse response;
  std::string error;  ///< non-empty: no response (timeout, reset, refused)
  int instance = 0;   ///< the gateway instance it was sent to
  Clock::time_point start;
  Clock::time_point done;

  bool answered() const { return error.empty(); }
  Clock::duration elapsed() const { return done - start; }
};

/// Sends `request` on a fresh connection to 127.0.0.1:`port`; `timeout` is the client's safety
/// net against a hang, not a bound.
Timed timed_request(std::uint16_t port, const HttpRequest& request,
                    std::chrono::milliseconds timeout = kEventDeadline);

/// timed_request() to `instance` of `gateway`, recorded as sent there.
Timed send_timed(const e2e::Gateway& gateway, const HttpRequest& request, int instance = 0);

/// Sends `request` to `instance` of `gateway` every `interval` while the answer is a 503 (the
/// gateway has not found its store again yet), until kEventDeadline passed; counts the kind of
/// every answer in `kinds` when given. Returns the last answer.
Timed send_until_not_503(const e2e::Gateway& gateway, const HttpRequest& request, int instance,
                         std::chrono::milliseconds interval,
                         std::map<std::string, int>* kinds = nullptr);

/// `Idempotent-Replayed: true`: a stored answer (C16).
bool replayed(const HttpResponse& r);

/// 200 or 201: the payment service's own successes (a new payment, or the one its UNIQUE
/// constraint found).
bool success(const HttpResponse& r);

/// Executed now by the upstream under the contract: its own success, not a replay and not an
/// unprotected forward (no `Idempotency-Status`, C25).
bool executed(const HttpResponse& r);

/// 409 problem+json of type request-in-flight with Retry-After (C18, C23, C26).
bool in_flight(const HttpResponse& r);

/// 503 problem+json of type store-unavailable with Retry-After (C25 fail_closed).
bool store_unavailable(const HttpResponse& r);

/// The kind of a keyed answer: `no-answer`, `executed`, `replayed` (a success that is a replay),
/// `409` (in_flight), `503` (store_unavailable), or `other-<status>`.
std::string kind_of(const Timed& t);

/// The kinds a keyed request may get while a store fails over, restarts or is out of reach
/// (C18, C25, C41, C43, C44): executed, replayed, 409 or 503.
bool allowed_kind(const std::string& kind);

/// `kind=n kind=n …` in the order of the kinds' names, for figures lines.
std::string summary(const std::map<std::string, int>& kinds);

/// `d` in whole milliseconds.
std::int64_t ms(Clock::duration d);

/// Prints the scenario line `scenario=<name> executions=<n> distinct_keys=<k>`.
void report(const std::string& scenario, std::uint64_t executions, std::uint64_t distinct_keys);

}  // namespace idemgate::test
