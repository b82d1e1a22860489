#pragma once
// Invariant checks inside fuzz targets: a broken invariant aborts, which libFuzzer and the corpus
// replay driver both report as a crash with the input that caused it.

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace idemgate::fuzz {

/// Aborts with `what` on stderr when `ok` is false.
inline void check(bool ok, std::string_view what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

/// Splits `data` at every `sep`; n separators give n + 1 pieces (empty ones included).
template <class Out>
void split(std::string_view data, char sep, Out& out) {
  for (;;) {
    const auto at = data.find(sep);
    out.emplace_back(data.substr(0, at));
    if (at == std::string_view::npos) return;
    data.remove_prefix(at + 1);
  }
}

}  // namespace idemgate::fuzz
