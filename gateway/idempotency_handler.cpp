#include "gateway/idempotency_handler.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/string.hpp>
#include <string_view>
#include <vector>

#include "gateway/contract_problem.hpp"
#include "gateway/core/fingerprint.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/cors.hpp"
#include "gateway/http/answer.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/upstream_pool.hpp"
#include "gateway/request_identity.hpp"

namespace idemgate {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

namespace {

/// Whether the contract reads a field the gateway added as a line (Exchange::added): only a
/// configuration that names X-Forwarded-*, Via or the request id's field does.
bool reads_added(const config::RouteContract& contract, const http::AddedFields& added) {
  if (added.empty()) return false;
  const auto any = [&](const std::vector<std::string>& names) {
    return std::any_of(names.begin(), names.end(),
                       [&](const std::string& name) { return added.has(name); });
  };
  const config::Idempotency& idem = contract.idempotency;
  return (contract.cors && (added.has("Origin") || added.has("Access-Control-Request-Method") ||
                            added.has("Access-Control-Request-Headers"))) ||
         any(idem.key_scope_headers) || any(idem.fingerprint_headers) || any(idem.key_headers) ||
         any(idem.key.fields);
}

bool method_listed(const std::vector<std::string>& methods, std::string_view method) {
  return std::any_of(methods.begin(), methods.end(),
                     [&](const std::string& m) { return beast::iequals(m, method); });
}

// Framing and Date are the session's to set; the rest of the fields are end-to-end (the
// upstream pool has removed hop-by-hop ones).
bool kept_in_record(std::string_view name) {
  return !beast::iequals(name, "Content-Length") && !beast::iequals(name, "Date") &&
         !beast::iequals(name, kReplayedField) && !beast::iequals(name, kBodyOmittedField) &&
         !beast::iequals(name, kStatusField);
}

core::UpstreamReply to_reply(http::ForwardResult result) {
  core::UpstreamReply reply;
  reply.detail = std::move(result.detail);
  switch (result.kind) {
    case http::ForwardResult::Kind::response:
      reply.kind = core::UpstreamReply::Kind::response;
      break;
    case http::ForwardResult::Kind::not_reached:
      reply.kind = core::UpstreamReply::Kind::not_reached;
      return reply;
    case http::ForwardResult::Kind::unknown_outcome:
      reply.kind = core::UpstreamReply::Kind::unknown_outcome;
      return reply;
    case http::ForwardResult::Kind::timed_out:
      reply.kind = core::UpstreamReply::Kind::timed_out;
      return reply;
  }
  auto& res = result.response;
  reply.response.body_omitted = result.tail != nullptr;  // passed on, never held (C39)
  reply.response.status = static_cast<std::uint16_t>(res.result_int());
  for (const auto& field : res) {
    if (kept_in_record(field.name_string())) {
      reply.response.headers.emplace_back(std::string(field.name_string()),
                                          std::string(field.value()));
    }
  }
  reply.response.body = std::move(res.body());
  return reply;
}

// Version, keep-alive, Date and framing are set by the session when it writes the response.
constexpr unsigned kHttp11 = 11;

http::Response to_response(core::StoredResponse stored) {
  http::Response res{static_cast<bhttp::status>(stored.status), kHttp11};
  for (auto& [name, value] : stored.headers) res.insert(name, value);
  res.body() = std::move(stored.body);
  return res;
}

http::Response problem(http::Problem kind, std::string detail) {
  return http::make_problem(kind, std::move(detail), kHttp11, true);
}

http::Response upstream_problem(core::UpstreamReply::Kind kind, std::string detail) {
  switch (kind) {
    case core::UpstreamReply::Kind::timed_out:
      return problem(http::Problem::upstream_timeout, std::move(detail));
    case core::UpstreamReply::Kind::unknown_outcome:
      return problem(http::Problem::upstream_failed, std::move(detail));
    default:
      return problem(http::Problem::upstream_unreachable, std::move(detail));
  }
}

/// The 400 detail for a request without the route's key: which fields or pointer to send.
std::string missing_key_detail(const config::Idempotency& idem) {
  std::string detail;
  switch (idem.key.kind) {
    case core::KeySpec::Kind::header:
      detail = "this route requires an " + idem.key.fields.front() + " header";
      for (std::size_t i = 1; i < idem.key.fields.size(); ++i) {
        detail += (i == 1 ? " (or " : ", or ") + idem.key.fields[i];
      }
      if (idem.key.fields.size() > 1) detail += ")";
      detail +=
          ": send a unique value (e.g. a UUID) per operation and repeat it on retries of that "
          "operation";
      break;
    case core::KeySpec::Kind::headers:
      detail = "this route requires the key headers";
      for (const auto& h : idem.key.fields) detail += " " + h;
      break;
    case core::KeySpec::Kind::json_pointer:
      detail = "this route requires a JSON body with a key at " + idem.key.json_pointer;
      break;
  }
  return detail;
}

/// The client's answer for the filter's decision. `tail`: the rest of a body past
/// max_stored_response (C39), passed on after an execution.
http::HandlerResult keyed_answer(core::FilterResult decision, std::string key_hash,
                                 std::shared_ptr<http::ResponseTail> tail,
                                 const config::Idempotency& idem) {
  http::HandlerResult result;
  result.outcome = core::outcome_label(decision.outcome);
  result.key_hash = std::move(key_hash);
  result.upstream_time = decision.upstream_time;
  switch (decision.outcome) {
    case core::Outcome::executed:
    case core::Outcome::not_stored:
      result.response = to_response(std::move(decision.response));
      result.tail = std::move(tail);
      break;
    case core::Outcome::unprotected:
      result.response = to_response(std::move(decision.response));
      result.response.set(kStatusField, "unprotected");
      result.tail = std::move(tail);
      break;
    case core::Outcome::replayed: {
      const bool omitted = decision.response.body_omitted;
      result.response = to_response(std::move(decision.response));
      result.response.set(kReplayedField, "true");
      if (omitted) result.response.set(kBodyOmittedField, "true");
      break;
    }
    case core::Outcome::mismatch: {
      result.response = make_problem(ContractProblem::key_mismatch, std::move(decision.detail),
                                     static_cast<unsigned>(idem.on_mismatch));
      break;
    }
    case core::Outcome::in_flight:
      result.response =
          make_problem(ContractProblem::request_in_flight, std::move(decision.detail));
      result.response.set(bhttp::field::retry_after, "1");
      break;
    case core::Outcome::store_unavailable:
      result.response =
          make_problem(ContractProblem::store_unavailable, std::move(decision.detail));
      result.response.set(bhttp::field::retry_after, "1");
      break;
    case core::Outcome::upstream_error:
      result.response = upstream_problem(decision.upstream_kind, std::move(decision.detail));
      break;
    case core::Outcome::shed:
      result.response = problem(http::Problem::overloaded, std::move(decision.detail));
      result.response.set(bhttp::field::retry_after, "1");
      break;
  }
  return result;
}

}  // namespace

core::RoutePolicy route_policy(const config::Idempotency& idempotency) {
  core::RoutePolicy policy;
  policy.ttl = idempotency.ttl;
  policy.lock_ttl = idempotency.lock_ttl;
  policy.wait_for_in_flight = idempotency.concurrency == config::Concurrency::wait;
  policy.wait_timeout = idempotency.wait_timeout;
  policy.max_waiters = idempotency.max_waiters;
  policy.store_statuses = idempotency.store_statuses;
  policy.max_stored_response = idempotency.max_stored_response;
  policy.hold_on_unknown_outcome = idempotency.on_unknown_outcome == config::UnknownOutcome::hold;
  policy.fail_open = idempotency.on_store_error == config::StoreErrorPolicy::fail_open;
  policy.commit_timeout = idempotency.commit_timeout;
  policy.replay_cache_ttl = idempotency.replay_cache_ttl;
  policy.replay_cache_max_bytes = idempotency.replay_cache_max_bytes;
  return policy;
}

IdempotencyHandler::IdempotencyHandler(http::Forwarder& forwarder, core::RecordStore& store,
                                       core::LockService& lock, core::FilterEvents events,
                                       std::shared_ptr<core::CommitBudget> budget)
    : forwarder_(forwarder), filter_(store, lock, std::move(events), std::move(budget)) {}

asio::awaitable<http::HandlerResult> IdempotencyHandler::pass_through(http::Exchange exchange,
                                                                      const char* outcome) {
  http::ForwardResult fwd = co_await forwarder_.forward(
      *exchange.upstream, std::move(exchange.forwardable()),
      std::min(config::contract_of(*exchange.route).idempotency.max_stored_response,
               exchange.pass_through_hold),
      std::move(exchange.body_source));
  http::HandlerResult result;
  result.tail = std::move(fwd.tail);
  result.outcome = fwd.kind == http::ForwardResult::Kind::response ? outcome : "upstream_error";
  result.upstream_time = fwd.upstream_time;
  result.response = http::forward_result_response(std::move(fwd));
  // Gateway-owned fields never come from an upstream, on pass-through routes either (C16).
  strip_owned_fields(result.response.base());
  co_return result;
}

bool IdempotencyHandler::holds(const config::Route& route,
                               const bhttp::request_header<>& header) const {
  const config::RouteContract& contract = config::contract_of(route);
  if (contract.cors && is_preflight(header)) return true;  // answered by handle() (C57)
  const config::Idempotency& idem = contract.idempotency;
  if (idem.mode == config::IdempotencyMode::off ||
      !method_listed(idem.methods, header.method_string())) {
    return false;
  }
  if (idem.mode == config::IdempotencyMode::required) return true;
  if (idem.key.kind == core::KeySpec::Kind::json_pointer) return true;
  return std::any_of(idem.key.fields.begin(), idem.key.fields.end(),
                     [&](const std::string& name) { return header.count(name) > 0; });
}

void IdempotencyHandler::add_route_fields(const config::Route& route, std::string_view origin,
                                          bhttp::response_header<>& header) const {
  add_cors_fields(route, origin, header);
}

void IdempotencyHandler::strip_owned_fields(bhttp::fields& fields) const {
  http::erase_fields(fields, {kReplayedField, kBodyOmittedField, kStatusField});
}

// Not a coroutine: the checks before the filter run at the call, and only what crosses a
// suspension lives in a coroutine frame. Asio recycles frames up to 1020 bytes; a larger one is a
// fresh heap block per request, and a block that size sends glibc's malloc through its slow path
// (fastbin consolidation) for the allocations after it.
asio::awaitable<http::HandlerResult> IdempotencyHandler::handle(http::Exchange exchange) {
  http::Request& req = exchange.request;  // without the fields the gateway owns (C16)

  // C57: the gateway answers for a route with cors; the upstream never sees the preflight.
  const config::RouteContract& contract = config::contract_of(*exchange.route);
  // A field the contract reads is read as the upstream would get it.
  if (reads_added(contract, exchange.added)) exchange.forwardable();
  if (contract.cors && is_preflight(req)) {
    http::HandlerResult preflight;
    preflight.response = preflight_response(*exchange.route, req);
    preflight.outcome = "preflight";
    preflight.route_fields_set = true;
    return http::answer_now(std::move(preflight));
  }
  const config::Idempotency& idem = contract.idempotency;
  if (idem.mode == config::IdempotencyMode::off ||
      !method_listed(idem.methods, req.method_string())) {
    return pass_through(std::move(exchange), "passthrough");  // C11, C12
  }

  const core::KeyParse key = request_key(idem, req.base(), req.body());
  if (key.status == core::KeyParse::Status::invalid) {
    // Named first: GCC 12 mishandles an aggregate temporary passed to a coroutine by value.
    http::HandlerResult invalid{
        make_problem(ContractProblem::invalid_key, key.detail), "invalid_key", {}, {}};
    return http::answer_now(std::move(invalid));
  }
  if (key.status == core::KeyParse::Status::absent) {
    if (idem.mode == config::IdempotencyMode::optional) {
      return pass_through(std::move(exchange), "passthrough");  // C11
    }
    http::HandlerResult missing{
        make_problem(ContractProblem::missing_key, missing_key_detail(idem)),
        "missing_key",
        {},
        {}};
    return http::answer_now(std::move(missing));
  }

  const core::Sha256 scope = request_scope(*exchange.route, req);
  core::KeyedRequest keyed;
  keyed.id = core::record_id(scope, key.key);
  keyed.route = exchange.route->name;
  keyed.fingerprint = request_fingerprint(idem, req);
  std::string key_hash = core::to_hex(keyed.id);

  // C14: what the upstream sees of the key (the key_headers fields, C37, C55).
  if (idem.upstream_key_applies && idem.upstream_key != config::UpstreamKey::passthrough) {
    std::string rewritten;
    if (idem.upstream_key == config::UpstreamKey::rewrite) {
      rewritten = core::upstream_key_rewrite(idem.upstream_key_secret, scope, key.key);
    }
    for (const auto& name : idem.key_headers) {
      if (req.count(name) == 0) continue;
      if (rewritten.empty()) {
        req.erase(name);
      } else {
        req.set(name, rewritten);
      }
    }
  }

  // The request and its upstream live in a shared state owned by the filter's coroutine, which
  // runs on its own: the session going away does not cancel it (C34).
  auto shared = std::make_shared<KeyedExchange>();
  shared->policy = route_policy(idem);
  shared->exchange = std::move(exchange);
  return run_keyed(std::move(shared), std::move(keyed), std::move(key_hash));
}

asio::awaitable<http::HandlerResult> IdempotencyHandler::run_keyed(
    std::shared_ptr<KeyedExchange> shared, core::KeyedRequest keyed, std::string key_hash) {
  const config::Idempotency& idem = config::contract_of(*shared->exchange.route).idempotency;
  // A body past max_stored_response is not held: its tail waits here until the record is
  // committed, then goes to the client as it arrives (C39).
  auto tail = std::make_shared<std::shared_ptr<http::ResponseTail>>();
  auto executor = co_await asio::this_coro::executor;
  // Built in a statement of its own: the request and the callback are moved into the filter's
  // frame, not kept in this one. The policy lives in `shared`, which the callback holds.
  auto filter_run = filter_.run(
      shared->policy, std::move(keyed),
      core::IdempotencyFilter::Forward(
          [shared, tail, forwarder = &forwarder_]() -> asio::awaitable<core::UpstreamReply> {
            http::ForwardResult fwd = co_await forwarder->forward(
                *shared->exchange.upstream, std::move(shared->exchange.forwardable()),
                config::contract_of(*shared->exchange.route).idempotency.max_stored_response);
            *tail = fwd.tail;
            co_return to_reply(std::move(fwd));
          }));
  core::FilterResult decision =
      co_await asio::co_spawn(executor, std::move(filter_run), asio::use_awaitable);
  co_return keyed_answer(std::move(decision), std::move(key_hash), std::move(*tail), idem);
}

}  // namespace idemgate
