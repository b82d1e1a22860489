#define BOOST_TEST_MODULE config_reference
#include <boost/test/unit_test.hpp>

#include "gateway/config/reference.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cfg = idemgate::config;

namespace {

std::string read_reference() {
  const char* dir = std::getenv("IDEMGATE_SOURCE_DIR");
  BOOST_TEST_REQUIRE(dir != nullptr, "IDEMGATE_SOURCE_DIR is not set (ctest sets it)");
  std::ifstream in(std::filesystem::path(dir) / "conf" / "REFERENCE.md", std::ios::binary);
  BOOST_TEST_REQUIRE(static_cast<bool>(in), "cannot read conf/REFERENCE.md");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// The reference's key tables are the loader's tables, rendered: a key added, renamed or given
// another default or range in the code changes them, and this test fails until the file is
// regenerated with `idemgate-config-reference conf/REFERENCE.md`.
BOOST_AUTO_TEST_CASE(reference_key_tables_are_the_loaders_tables_byte_for_byte) {
  const std::string text = read_reference();
  const std::string updated = cfg::update_reference(text);
  if (updated != text) {
    // Name the first differing line to make the failure readable.
    std::istringstream a(text), b(updated);
    std::string la, lb;
    int line = 0;
    while (std::getline(a, la) && std::getline(b, lb)) {
      ++line;
      if (la != lb) break;
    }
    BOOST_ERROR("conf/REFERENCE.md line " << line << " is out of date: has\n  " << la
                                          << "\nthe loader says\n  " << lb
                                          << "\nrun idemgate-config-reference conf/REFERENCE.md");
  }
}

BOOST_AUTO_TEST_CASE(every_table_is_in_the_reference_between_its_markers) {
  const std::string text = read_reference();
  for (const auto& table : cfg::reference_tables()) {
    const std::string block =
        "<!-- keys:" + table.id + " -->\n" + table.markdown + "<!-- /keys:" + table.id + " -->";
    BOOST_TEST(text.find(block) != std::string::npos, "table " << table.id);
  }
}

BOOST_AUTO_TEST_CASE(tables_render_name_type_default_and_range_of_each_key) {
  std::string limits;
  std::string idempotency;
  std::string storage;
  for (const auto& table : cfg::reference_tables()) {
    if (table.id == "limits") limits = table.markdown;
    if (table.id == "idempotency") idempotency = table.markdown;
    if (table.id == "storage") storage = table.markdown;
  }
  BOOST_TEST(limits.find("| `max_request_body` | size | `1MiB` | 0B – 1GiB | C04 |") !=
             std::string::npos);
  BOOST_TEST(
      idempotency.find("| `on_mismatch` | enum | `422` | `422` \\| `409` \\| `400` | C17 |") !=
      std::string::npos);
  BOOST_TEST(storage.find("| `redis.operation_timeout` | duration | `500ms` | 10ms – 1m | C25 |") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(unknown_or_unclosed_blocks_are_errors) {
  BOOST_CHECK_THROW(cfg::update_reference("<!-- keys:nope -->\n<!-- /keys:nope -->\n"),
                    std::runtime_error);
  BOOST_CHECK_THROW(cfg::update_reference("<!-- keys:limits -->\n"), std::runtime_error);
  // A reference without every table is incomplete.
  BOOST_CHECK_THROW(cfg::update_reference("# nothing\n"), std::runtime_error);
}
