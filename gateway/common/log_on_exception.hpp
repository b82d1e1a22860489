#pragma once
// The completion of a detached coroutine (asio::co_spawn): an exception that escaped it ends that
// task only; it is logged, never rethrown into the io thread (STYLE "Errors at the edges").

#include <spdlog/common.h>
#include <exception>
#include <string>

namespace idemgate::common {

/// The text of an exception_ptr's exception: what() for a std::exception, "unknown exception"
/// otherwise; "" for a null pointer.
std::string exception_text(const std::exception_ptr& e);

/// A co_spawn completion handler that logs `{"msg": what, "error": ...}` at `level` when the task
/// ended with an exception and does nothing otherwise. `what` must outlive the task (a literal).
/// Also takes completions with a result (`void(std::exception_ptr, T)`), ignoring the result.
struct LogOnException {
  const char* what;
  spdlog::level::level_enum level = spdlog::level::err;

  void operator()(std::exception_ptr e) const;
  template <class T>
  void operator()(std::exception_ptr e, T&&) const {
    (*this)(std::move(e));
  }
};

/// The one completion for detached tasks: `asio::co_spawn(ex, task(), log_on_exception("…"))`.
inline LogOnException log_on_exception(const char* what,
                                       spdlog::level::level_enum level = spdlog::level::err) {
  return LogOnException{what, level};
}

}  // namespace idemgate::common
