#include "tests/support/metric_text.hpp"

#include <sstream>
#include <string_view>

namespace idemgate::test {

std::optional<double> metric_value(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos || line.substr(0, name_end) != name) continue;
    std::map<std::string, std::string> found;
    std::size_t value_start = name_end;
    if (line[name_end] == '{') {
      const auto close = line.find('}', name_end);
      if (close == std::string::npos) continue;
      std::string_view set(line.data() + name_end + 1, close - name_end - 1);
      while (!set.empty()) {
        const auto eq = set.find("=\"");
        const auto end = set.find('"', eq + 2);
        if (eq == std::string_view::npos || end == std::string_view::npos) break;
        found[std::string(set.substr(0, eq))] = std::string(set.substr(eq + 2, end - eq - 2));
        set.remove_prefix(end + 1);
        if (!set.empty() && set.front() == ',') set.remove_prefix(1);
      }
      value_start = close + 1;
    }
    bool match = true;
    for (const auto& [k, v] : labels) {
      const auto it = found.find(k);
      match = match && it != found.end() && it->second == v;
    }
    if (match) return std::stod(line.substr(value_start));
  }
  return std::nullopt;
}

}  // namespace idemgate::test
