#include "tests/support/keys_cli.hpp"

#include <boost/test/unit_test.hpp>

#include "tests/support/process.hpp"

namespace idemgate::test {

void check_keys_show_and_purge(const e2e::Gateway& gateway, const std::string& route,
                               const std::string& key) {
  const std::string id = e2e::record_id_hex(route, key);
  const std::string marker = e2e::lock_key(id);
  e2e::Database db(require_env("IDEMGATE_PG_DSN"));
  const auto rows = [&] {
    return db.scalar("SELECT count(*) FROM idempotency_record WHERE id = decode($1, 'hex')", {id});
  };
  const auto keys = [&](const std::string& action) {
    return e2e::run_keys(gateway.config_path(), gateway.dir(), {action, "--route", route, key});
  };
  BOOST_TEST_REQUIRE(rows() == "1", "the record of " << key << " is not in Postgres");

  const auto shown = keys("show");
  BOOST_TEST(shown.status == 0, shown.err);
  for (const std::string& line : {"id " + id, "route " + route, std::string("status 201"),
                                  std::string("replay_marker present")}) {
    BOOST_TEST(shown.out.find(line + "\n") != std::string::npos, line << " not in:\n" << shown.out);
  }

  const auto purged = keys("purge");
  BOOST_TEST(purged.status == 0, purged.err);
  BOOST_TEST(purged.out.find("deleted record " + id + "\n") != std::string::npos, purged.out);
  BOOST_TEST(purged.out.find("deleted replay marker " + marker + "\n") != std::string::npos,
             purged.out);
  BOOST_TEST(rows() == "0", "the purged record's row is still in Postgres");

  const auto gone = keys("show");
  BOOST_TEST(gone.status == 1);
  BOOST_TEST(gone.out == "not found\n");
}

}  // namespace idemgate::test
