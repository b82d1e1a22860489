#define BOOST_TEST_MODULE redis_resp_test
#include <hiredis/hiredis.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "storage/redis/redis_connection.hpp"

using idemgate::storage::redis::append_resp_command;
using idemgate::storage::redis::Command;

namespace {

/// What hiredis's own formatter writes for `argv`: the reference the gateway's must equal.
std::string hiredis_format(const Command& argv) {
  std::vector<const char*> args;
  std::vector<std::size_t> lengths;
  for (const auto& a : argv) {
    args.push_back(a.data());
    lengths.push_back(a.size());
  }
  char* out = nullptr;
  const int n =
      redisFormatCommandArgv(&out, static_cast<int>(args.size()), args.data(), lengths.data());
  BOOST_REQUIRE(n > 0);
  std::string text(out, static_cast<std::size_t>(n));
  std::free(out);
  return text;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_command_is_an_array_of_bulk_strings) {
  std::string out;
  append_resp_command(out, {"SET", "k", "v"});
  BOOST_TEST(out == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
}

BOOST_AUTO_TEST_CASE(the_bytes_equal_hiredis_formatting_for_every_shape) {
  const std::vector<Command> commands = {
      {"PING"},
      {"GET", ""},                                              // an empty argument
      {"SET", std::string("a\r\nb\0c", 6), "v"},                // CR, LF and NUL inside
      {"SET", "key", std::string(100000, 'x'), "PX", "30000"},  // a six-digit length
      {"EVALSHA", "0123456789abcdef0123456789abcdef01234567", "1", "k", "a", "b", "c", "d", "e",
       "f", "g"},  // a two-digit count
  };
  for (const auto& command : commands) {
    std::string out;
    append_resp_command(out, command);
    BOOST_TEST(out == hiredis_format(command));
  }
}

BOOST_AUTO_TEST_CASE(commands_are_appended_behind_what_the_buffer_holds) {
  std::string out = "prefix";
  append_resp_command(out, {"PING"});
  append_resp_command(out, {"ECHO", "x"});
  BOOST_TEST(out == "prefix*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n");
}
