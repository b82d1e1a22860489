#define BOOST_TEST_MODULE redis_cluster_test
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "storage/redis/redis_cluster.hpp"

using idemgate::storage::redis::kClusterSlots;
using idemgate::storage::redis::key_slot;
using idemgate::storage::redis::parse_cluster_slots;
using idemgate::storage::redis::Reply;

namespace {

Reply integer(long long n) {
  Reply r;
  r.kind = Reply::Kind::integer;
  r.integer = n;
  return r;
}

Reply string(std::string s) {
  Reply r;
  r.kind = Reply::Kind::string;
  r.str = std::move(s);
  return r;
}

Reply array(std::vector<Reply> elements) {
  Reply r;
  r.kind = Reply::Kind::array;
  r.elements = std::move(elements);
  return r;
}

/// One `CLUSTER SLOTS` entry: the range, its primary and one replica.
Reply entry(long long first, long long last, const std::string& host, long long port) {
  return array({integer(first), integer(last), array({string(host), integer(port), string("id")}),
                array({string("127.0.0.9"), integer(7100), string("replica-id")})});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(key_slot_)

BOOST_AUTO_TEST_CASE(spec_C42_slot_is_crc16_xmodem_modulo_16384) {
  // CRC16/XMODEM("123456789") is the check value 0x31C3 of the Redis Cluster specification.
  BOOST_TEST(key_slot("123456789") == 0x31C3);
  BOOST_TEST(key_slot("foo") == 12182);
  BOOST_TEST(key_slot("bar") == 5061);
  BOOST_TEST(key_slot("") == 0);
  for (const char* key : {"a", "idem:lock:k-1", "\xff\x00\x80"})
    BOOST_TEST(key_slot(key) < kClusterSlots);
}

BOOST_AUTO_TEST_CASE(spec_C42_hash_tag_decides_the_slot) {
  BOOST_TEST(key_slot("{user1000}.following") == key_slot("{user1000}.followers"));
  BOOST_TEST(key_slot("{user1000}.following") == key_slot("user1000"));
  BOOST_TEST(key_slot("foo{bar}zap") == key_slot("bar"));
  // Only the first `{` counts, up to the next `}`.
  BOOST_TEST(key_slot("foo{{bar}}zap") == key_slot("{bar"));
  BOOST_TEST(key_slot("foo{bar}{zap}") == key_slot("bar"));
}

BOOST_AUTO_TEST_CASE(spec_C42_empty_or_unclosed_tag_hashes_the_whole_key) {
  BOOST_TEST(key_slot("foo{}{bar}") != key_slot("bar"));
  BOOST_TEST(key_slot("foo{}{bar}") == 8363);  // CLUSTER KEYSLOT foo{}{bar}
  BOOST_TEST(key_slot("{}") != key_slot(""));
  BOOST_TEST(key_slot("foo{bar") != key_slot("bar"));
  BOOST_TEST(key_slot("}foo{") != key_slot("foo"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(parse_cluster_slots_)

BOOST_AUTO_TEST_CASE(spec_C42_ranges_come_sorted_with_their_primary) {
  const auto reply = array({entry(10923, 16383, "127.0.0.1", 7002),
                            entry(0, 5460, "127.0.0.1", 7000), entry(5461, 10922, "::1", 7001)});
  const auto ranges = parse_cluster_slots(reply, "seed");
  BOOST_REQUIRE(ranges.has_value());
  BOOST_REQUIRE_EQUAL(ranges->size(), 3u);
  BOOST_TEST((*ranges)[0].first == 0);
  BOOST_TEST((*ranges)[0].last == 5460);
  BOOST_TEST((*ranges)[0].host == "127.0.0.1");
  BOOST_TEST((*ranges)[0].port == 7000);
  BOOST_TEST((*ranges)[1].host == "::1");
  BOOST_TEST((*ranges)[1].port == 7001);
  BOOST_TEST((*ranges)[2].first == 10923);
  BOOST_TEST((*ranges)[2].last == 16383);
}

BOOST_AUTO_TEST_CASE(spec_C42_primary_without_address_is_the_asked_node) {
  const auto ranges = parse_cluster_slots(array({entry(0, 16383, "", 7000)}), "10.0.0.5");
  BOOST_REQUIRE(ranges.has_value());
  BOOST_TEST(ranges->at(0).host == "10.0.0.5");
}

BOOST_AUTO_TEST_CASE(spec_C42_a_primary_without_replicas_and_redis7_extra_fields_parse) {
  // Redis 7 appends a map of host names to each node; a range may have no replica.
  const auto node = array({string("127.0.0.1"), integer(7000), string("id"), array({})});
  const auto ranges = parse_cluster_slots(array({array({integer(0), integer(16383), node})}), "");
  BOOST_REQUIRE(ranges.has_value());
  BOOST_TEST(ranges->size() == 1u);
}

BOOST_AUTO_TEST_CASE(spec_C42_no_ranges_is_an_empty_map) {
  const auto ranges = parse_cluster_slots(array({}), "seed");
  BOOST_REQUIRE(ranges.has_value());
  BOOST_TEST(ranges->empty());
}

BOOST_AUTO_TEST_CASE(spec_C42_other_shapes_are_refused) {
  Reply error;
  error.kind = Reply::Kind::error;
  error.str = "ERR This instance has cluster support disabled";
  const std::vector<Reply> bad = {
      error,
      string("0 16383"),
      array({integer(0)}),
      array({array({integer(0), integer(16383)})}),
      array({array({integer(0), integer(16383), string("127.0.0.1:7000")})}),
      array({array({integer(0), integer(16383), array({string("127.0.0.1")})})}),
      array({array({string("0"), integer(16383), array({string("h"), integer(7000)})})}),
      array({array({integer(0), integer(16383), array({integer(1), integer(7000)})})}),
      array({entry(0, 16384, "h", 7000)}),
      array({entry(-1, 10, "h", 7000)}),
      array({entry(10, 9, "h", 7000)}),
      array({entry(0, 10, "h", 0)}),
      array({entry(0, 10, "h", 65536)}),
      array({entry(0, 10, "h", 7000), entry(10, 20, "h", 7001)}),  // overlap
  };
  for (std::size_t i = 0; i < bad.size(); ++i)
    BOOST_TEST(!parse_cluster_slots(bad[i], "seed").has_value(), "shape " << i);
}

BOOST_AUTO_TEST_SUITE_END()
