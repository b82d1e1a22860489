#include "gateway/http/answer.hpp"

#include <exception>
#include <string>

#include "gateway/common/json_log.hpp"
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

boost::asio::awaitable<HandlerResult> answer_routed(RequestHandler& handler, RoutedRequest in,
                                                    unsigned version, bool& keep_alive) {
  HandlerResult result;
  const auto upstream =
      in.route ? in.config->upstreams.find(in.route->upstream) : in.config->upstreams.end();
  if (in.shed) {
    result.response = shed_response(route_full_detail(*in.route), version, keep_alive);
    result.outcome = "shed";
    co_return result;
  }
  if (!in.route) {
    const std::string_view t(in.request.target().data(), in.request.target().size());
    result.response = make_problem(Problem::route_not_found,
                                   "no route matches " + std::string(in.request.method_string()) +
                                       " " + std::string(target_path(t)),
                                   version, keep_alive);
    result.outcome = "no_route";
    co_return result;
  }
  if (upstream == in.config->upstreams.end()) {
    result.response =
        make_problem(Problem::internal_error,
                     "route " + in.route->name + " names an unknown upstream", version, keep_alive);
    result.outcome = "internal_error";
    co_return result;
  }
  const std::string method(in.request.method_string());
  const std::string target(in.request.target());
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
  std::string failure;
  try {
    co_return co_await handler.handle(std::move(exchange));
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "unknown exception";
  }
  log_json(spdlog::level::err, "handler failed",
           {{"route", route.name},
            {"method", method},
            {"target", target},
            {"error", failure},
            {"request_id", in.request_id}});
  keep_alive = false;
  result.response = make_problem(Problem::internal_error,
                                 "the gateway failed while handling the request", version, false);
  result.outcome = "internal_error";
  co_return result;
}

}  // namespace idemgate::http
