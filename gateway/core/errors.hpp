#pragma once
// Error conditions the idempotency core branches on. Store implementations return these codes
// (or codes of their own category whose default_error_condition maps onto them); the core never
// looks at a Postgres- or Redis-specific code.

#include <boost/system/error_code.hpp>
#include <string>
#include <type_traits>

namespace idemgate::core {

enum class store_errc {
  unavailable = 1,  ///< cannot reach the store (connect refused, connection lost, server down)
  timed_out,        ///< an operation ran past its operation_timeout; the connection was dropped
  protocol,         ///< the store answered something the client did not expect
  conflict,         ///< a uniqueness conflict that the operation does not resolve itself
};

const boost::system::error_category& store_category() noexcept;

inline boost::system::error_code make_error_code(store_errc e) noexcept {
  return {static_cast<int>(e), store_category()};
}

}  // namespace idemgate::core

template <>
struct boost::system::is_error_code_enum<idemgate::core::store_errc> : std::true_type {};
