#include "gateway/common/log_on_exception.hpp"

#include "gateway/common/json_log.hpp"

namespace idemgate::common {

std::string exception_text(const std::exception_ptr& e) {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

void LogOnException::operator()(std::exception_ptr e) const {
  // Beast's awaitable example shows why the check is needed: a completion may carry a null
  // exception_ptr, which must not be rethrown.
  if (!e) return;
  log_json(level, what, {{"error", exception_text(e)}});
}

}  // namespace idemgate::common
