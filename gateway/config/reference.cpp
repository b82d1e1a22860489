#include "gateway/config/reference.hpp"

#include <stdexcept>

#include "gateway/config/loader.hpp"

namespace idemgate::config {
namespace {

std::string render(const std::vector<detail::KeyDoc>& rows) {
  std::string out =
      "| Key | Type | Default | Range | Serves | Notes |\n"
      "|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    out += "| `" + r.name + "` | " + r.type + " | " + r.default_value + " | " + r.range + " | " +
           r.serves + " | " + r.doc + " |\n";
  }
  return out;
}

template <class... Parts>
std::vector<detail::KeyDoc> concat(Parts&&... parts) {
  std::vector<detail::KeyDoc> out;
  (out.insert(out.end(), parts.begin(), parts.end()), ...);
  return out;
}

}  // namespace

std::vector<ReferenceTable> reference_tables() {
  using namespace detail;
  return {
      {"top", render(docs_of(top_keys()))},
      {"listen",
       render(concat(docs_of(listen_keys(), "listen."), docs_of(admin_keys(), "admin.")))},
      {"limits", render(docs_of(limits_keys()))},
      {"request_id", render(docs_of(request_id_keys()))},
      {"storage",
       render(concat(docs_of(postgres_keys(), "postgres."), docs_of(redis_keys(), "redis."),
                     docs_of(cleanup_keys(), "cleanup.")))},
      {"upstream", render(docs_of(upstream_keys()))},
      {"route", render(docs_of(route_keys()))},
      {"idempotency", render(docs_of(idempotency_keys()))},
      {"cors", render(docs_of(cors_keys()))},
  };
}

std::string update_reference(std::string_view text) {
  const auto tables = reference_tables();
  std::vector<bool> used(tables.size(), false);
  std::string out;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  auto next_line = [&](std::string_view& line) {
    if (pos >= text.size()) return false;
    const auto end = text.find('\n', pos);
    const std::size_t stop = end == std::string_view::npos ? text.size() : end + 1;
    line = text.substr(pos, stop - pos);
    pos = stop;
    ++line_no;
    return true;
  };
  const std::string_view open = "<!-- keys:";
  std::string_view line;
  while (next_line(line)) {
    out += line;
    if (line.substr(0, open.size()) != open) continue;
    const auto close = line.find(" -->");
    if (close == std::string_view::npos) {
      throw std::runtime_error("line " + std::to_string(line_no) + ": unterminated marker");
    }
    const std::string id(line.substr(open.size(), close - open.size()));
    std::size_t index = 0;
    while (index < tables.size() && tables[index].id != id) ++index;
    if (index == tables.size()) {
      throw std::runtime_error("line " + std::to_string(line_no) + ": no key table named " + id);
    }
    used[index] = true;
    const std::size_t opened_at = line_no;
    const std::string end_marker = "<!-- /keys:" + id + " -->";
    bool closed = false;
    while (next_line(line)) {
      if (line.substr(0, end_marker.size()) == end_marker) {
        out += tables[index].markdown;
        out += line;
        closed = true;
        break;
      }
    }
    if (!closed) {
      throw std::runtime_error("line " + std::to_string(opened_at) + ": " + id +
                               " has no end marker " + end_marker);
    }
  }
  for (std::size_t i = 0; i < tables.size(); ++i) {
    if (!used[i]) throw std::runtime_error("no block for key table " + tables[i].id);
  }
  return out;
}

}  // namespace idemgate::config
