#include "gateway/core/lock_service.hpp"

namespace idemgate::core {

boost::asio::awaitable<boost::system::result<bool>> LockService::try_acquire(
    Sha256 id, std::string token, std::chrono::milliseconds ttl) {
  auto result = co_await acquire(id, std::move(token), ttl);
  if (!result) co_return boost::system::result<bool>(boost::system::in_place_error, result.error());
  co_return result->acquired;
}

}  // namespace idemgate::core
