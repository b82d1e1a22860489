#pragma once
// The `idemgate keys` command (README, "One key by hand") against the stores of a running
// gateway, whichever Redis topology it follows.

#include <string>

#include "tests/e2e/gateway_fixture.hpp"

namespace idemgate::test {

/// For `key`, executed and committed on `route` of `gateway` (no key_scope headers):
/// `idemgate keys show` prints the record (its id, route, status 201) with the committed marker;
/// `keys purge` deletes both, naming the record id and the marker's key, and the record's row is
/// gone from the Postgres of IDEMGATE_PG_DSN; `keys show` then prints `not found` (exit 1).
/// The marker's absence from Redis is the caller's to check, on the node that held it.
void check_keys_show_and_purge(const e2e::Gateway& gateway, const std::string& route,
                               const std::string& key);

}  // namespace idemgate::test
