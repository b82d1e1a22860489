#pragma once
// The verdict of one check of a store's settings (SPEC C58): the storage modules produce them,
// the readiness report renders them for /readyz, `check-config --stores` and the start-up log.

#include <string>
#include <string_view>

namespace idemgate::core {

struct StoreCheck {
  enum class Verdict {
    ok,
    warning,  ///< the gateway works, with a risk the operator should know (or could not look)
    failed,   ///< the gateway must not run on this store as it is
  };
  std::string name;  ///< what was checked, e.g. `redis maxmemory-policy`
  Verdict verdict = Verdict::ok;
  std::string detail;  ///< one sentence: the value found and what it means
};

/// `ok`, `warning` or `failed`.
constexpr std::string_view verdict_text(StoreCheck::Verdict verdict) {
  switch (verdict) {
    case StoreCheck::Verdict::ok:
      return "ok";
    case StoreCheck::Verdict::warning:
      return "warning";
    case StoreCheck::Verdict::failed:
      return "failed";
  }
  return "failed";
}

}  // namespace idemgate::core
