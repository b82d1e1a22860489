#pragma once
// The completion token of every coroutine in the project (STYLE "Async model"):
// `auto [ec, n] = co_await op(..., use_nothrow);` — errors come back as values, never as
// exceptions.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace idemgate::common {

inline constexpr auto use_nothrow = boost::asio::as_tuple(boost::asio::use_awaitable);

}  // namespace idemgate::common
