#include "gateway/http/answer.hpp"

#include <exception>
#include <string>

#include "gateway/common/json_log.hpp"
#include "gateway/common/log_on_exception.hpp"
#include "gateway/http/headers.hpp"
#include "gateway/http/problem.hpp"
#include "gateway/http/router.hpp"

namespace idemgate::http {

namespace bhttp = boost::beast::http;
using common::log_json;

RequestTimes times_of(std::chrono::steady_clock::time_point started) {
  const auto elapsed = std::chrono::steady_clock::now() - started;
  return {std::chrono::system_clock::now() -
              std::chrono::duration_cast<std::chrono::system_clock::duration>(elapsed),
          std::chrono::duration_cast<std::chrono::microseconds>(elapsed)};
}

double to_ms(std::chrono::microseconds us) {
  return static_cast<double>(us.count()) / 1000.0;
}

void prepare_forwarded(bhttp::fields& fields, std::string_view client_ip, std::string_view proto,
                       AddedFields& added) {
  strip_hop_by_hop(fields);
  erase_fields(fields, {"Expect"});
  add_forwarding_fields(fields, client_ip, proto, added);
}

Response shed_response(std::string detail, unsigned version, bool keep_alive) {
  Response res = make_problem(Problem::overloaded, std::move(detail), version, keep_alive);
  res.set(bhttp::field::retry_after, "1");
  return res;
}

std::string route_full_detail(const Route& route) {
  return "route " + route.name + " has " + std::to_string(route.max_in_flight) +
         " requests in progress (max_in_flight); nothing was forwarded, retry later";
}

boost::asio::awaitable<HandlerResult> answer_now(HandlerResult result) {
  co_return result;
}

namespace {

/// What a handler that failed is answered: logged, 500, and the connection closes after it.
HandlerResult handler_failed(std::string_view route, std::string_view method,
                             std::string_view target, std::string_view request_id,
                             std::string_view failure, unsigned version, bool& keep_alive) {
  log_json(spdlog::level::err, "handler failed",
           {{"route", route},
            {"method", method},
            {"target", target},
            {"error", failure},
            {"request_id", request_id}});
  keep_alive = false;
  HandlerResult result;
  result.response = make_problem(Problem::internal_error,
                                 "the gateway failed while handling the request", version, false);
  result.outcome = "internal_error";
  return result;
}

/// Awaits the handler's answer; a handler that throws while it runs is answered as above. Its
/// frame holds the names the log line needs, not the request.
boost::asio::awaitable<HandlerResult> guarded(boost::asio::awaitable<HandlerResult> call,
                                              const Route& route, std::string method,
                                              std::string target, std::string_view request_id,
                                              unsigned version, bool& keep_alive) {
  std::exception_ptr failure;
  try {
    co_return co_await std::move(call);
  } catch (...) {
    failure = std::current_exception();
  }
  co_return handler_failed(route.name, method, target, request_id, common::exception_text(failure),
                           version, keep_alive);
}

}  // namespace

// Not a coroutine: the answers that need no upstream are made at the call, and the request is
// handed to the handler before the first suspension, so this function's frame does not carry it
// (the handler's own coroutine may; see IdempotencyHandler::handle).
boost::asio::awaitable<HandlerResult> answer_routed(RequestHandler& handler, RoutedRequest in,
                                                    unsigned version, bool& keep_alive) {
  HandlerResult result;
  const auto upstream =
      in.route ? in.config->upstreams.find(in.route->upstream) : in.config->upstreams.end();
  if (in.shed) {
    result.response = shed_response(route_full_detail(*in.route), version, keep_alive);
    result.outcome = "shed";
    return answer_now(std::move(result));
  }
  if (!in.route) {
    const std::string_view t(in.request.target().data(), in.request.target().size());
    result.response = make_problem(Problem::route_not_found,
                                   "no route matches " + std::string(in.request.method_string()) +
                                       " " + std::string(target_path(t)),
                                   version, keep_alive);
    result.outcome = "no_route";
    return answer_now(std::move(result));
  }
  if (upstream == in.config->upstreams.end()) {
    result.response =
        make_problem(Problem::internal_error,
                     "route " + in.route->name + " names an unknown upstream", version, keep_alive);
    result.outcome = "internal_error";
    return answer_now(std::move(result));
  }
  std::string method(in.request.method_string());
  std::string target(in.request.target());
  const Route& route = *in.route;
  Exchange exchange{std::move(in.request),
                    std::move(in.config),
                    &route,
                    &upstream->second,
                    std::move(in.in_flight),
                    in.pass_through_hold,
                    std::move(in.body_source),
                    {}};
  if (in.added) exchange.added = *in.added;
  Request& request = exchange.request;
  const bool framed = request.has_content_length() || request.chunked();
  prepare_forwarded(request.base(), in.client_ip, in.proto, exchange.added);
  handler.strip_owned_fields(request.base());
  if (!exchange.body_source && (framed || !request.body().empty())) {
    request.content_length(request.body().size());
  }
  boost::asio::awaitable<HandlerResult> call;
  try {
    call = handler.handle(std::move(exchange));
  } catch (...) {
    HandlerResult failed =
        handler_failed(route.name, method, target, in.request_id,
                       common::exception_text(std::current_exception()), version, keep_alive);
    return answer_now(std::move(failed));
  }
  return guarded(std::move(call), route, std::move(method), std::move(target), in.request_id,
                 version, keep_alive);
}

}  // namespace idemgate::http
