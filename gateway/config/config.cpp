#include "gateway/config/config.hpp"

namespace idemgate::config {

const RouteContract& contract_of(const Route& route) {
  static const RouteContract kNone;
  const auto* found = std::any_cast<RouteContract>(&route.handler_config);
  return found ? *found : kNone;
}

RouteContract& contract_of(Route& route) {
  if (auto* found = std::any_cast<RouteContract>(&route.handler_config)) return *found;
  return route.handler_config.emplace<RouteContract>();
}

}  // namespace idemgate::config
