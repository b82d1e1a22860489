#pragma once
// The key tables of conf/REFERENCE.md, rendered from the loader's own tables, so that the
// reference cannot drift from what the loader accepts (names, types, defaults, ranges).

#include <string>
#include <string_view>
#include <vector>

namespace idemgate::config {

/// One table of the reference: `id` names its block in the markdown.
struct ReferenceTable {
  std::string id;
  std::string markdown;  ///< a header row, a separator row and one row per key, each ending "\n"
};

/// Every table, in the order the reference presents them: top, listen, limits, request_id,
/// storage, upstream, route, idempotency. Thread-safe.
std::vector<ReferenceTable> reference_tables();

/// `text` with the lines between each `<!-- keys:ID -->` line and its `<!-- /keys:ID -->` line
/// replaced by table ID; everything else is kept byte for byte. Throws std::runtime_error naming
/// the line for an unknown ID, a block without its end, or a table that has no block.
std::string update_reference(std::string_view text);

}  // namespace idemgate::config
