// The byte forms of idempotency_record columns (storage/pg/pg_record_codec.hpp; SPEC C16, C29):
// header blobs, and rows decoded into records or refused.
#define BOOST_TEST_MODULE pg_record_codec
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "storage/pg/pg_binary.hpp"
#include "storage/pg/pg_record_codec.hpp"

namespace core = idemgate::core;
namespace pg = idemgate::storage::pg;

namespace {

std::string big_endian(std::uint64_t value, int bytes) {
  std::string out;
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xff));
  }
  return out;
}

// 2026-12-01T00:00:00Z in Postgres microseconds.
constexpr std::int64_t kNow = 849'398'400'000'000;

struct Row {
  std::string route = "payments";
  std::string fingerprint = std::string(32, 'f');
  std::string status = big_endian(201, 4);
  std::string headers = pg::encode_headers({{"Content-Type", "application/json"}});
  std::string body = R"({"id":"p_1"})";
  std::string body_omitted = std::string(1, '\0');
  std::string created_at = big_endian(kNow, 8);
  std::string expires_at = big_endian(kNow + 86'400'000'000, 8);

  pg::RecordColumns columns() const {
    return {route, fingerprint, status, headers, body, body_omitted, created_at, expires_at};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(header_blob_round_trips_order_repeats_and_any_bytes) {
  const std::vector<core::HeaderField> headers = {
      {"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"}, {"X-Empty", ""}, {"X-Bin", {"\0\xff\r\n", 4}}};
  const std::string blob = pg::encode_headers(headers);
  const auto decoded = pg::decode_headers(blob);
  BOOST_REQUIRE(decoded);
  BOOST_TEST((*decoded == headers));
  BOOST_TEST(pg::encode_headers({}) == std::string(1, '\1'));
}

BOOST_AUTO_TEST_CASE(header_blob_cut_inside_a_field_or_of_another_format_is_refused) {
  const std::string blob = pg::encode_headers({{"Location", "/payments/p_1"}});
  for (std::size_t cut = 2; cut < blob.size(); ++cut) {
    BOOST_TEST(!pg::decode_headers(blob.substr(0, cut)), "cut at " << cut);
  }
  BOOST_TEST(!pg::decode_headers(""));
  BOOST_TEST(!pg::decode_headers("\2" + blob.substr(1)));
  BOOST_TEST(!pg::decode_headers(std::string("\1\xff\xff\xff\xffX", 6)));
}

BOOST_AUTO_TEST_CASE(a_row_decodes_to_the_record_it_holds) {
  const Row row;
  core::Sha256 id{};
  id[0] = 7;
  const auto record = pg::decode_record(row.columns(), id);
  BOOST_REQUIRE(record);
  BOOST_TEST(record->id == id);
  BOOST_TEST(record->route == "payments");
  BOOST_TEST(record->response.status == 201);
  BOOST_TEST(record->response.headers.size() == 1u);
  BOOST_TEST(record->response.body == row.body);
  BOOST_TEST(!record->response.body_omitted);
  BOOST_TEST(record->created_at.time_since_epoch() ==
             std::chrono::sys_days(std::chrono::year(2026) / 12 / 1).time_since_epoch());
  BOOST_TEST((record->expires_at - record->created_at == std::chrono::hours(24)));
}

BOOST_AUTO_TEST_CASE(a_malformed_row_is_refused) {
  const core::Sha256 id{};
  auto refused = [&](auto change) {
    Row row;
    change(row);
    return !pg::decode_record(row.columns(), id);
  };
  BOOST_TEST(refused([](Row& r) { r.status = big_endian(600, 4); }));
  BOOST_TEST(refused([](Row& r) { r.status = big_endian(99, 4); }));
  BOOST_TEST(refused([](Row& r) { r.status = "201"; }));
  BOOST_TEST(refused([](Row& r) { r.fingerprint.pop_back(); }));
  BOOST_TEST(refused([](Row& r) { r.headers.pop_back(); }));
  BOOST_TEST(refused([](Row& r) { r.body_omitted = std::string(2, '\0'); }));
  BOOST_TEST(refused([](Row& r) { r.expires_at.pop_back(); }));
  const Row row;
  auto columns = row.columns();
  columns.expires_at.reset();  // SQL NULL
  BOOST_TEST(!pg::decode_record(columns, id));
}

// Postgres sends 'infinity' and '-infinity' as the extreme int8 values, and keeps years up to
// 294276; system_clock (nanoseconds) ends in 2262. Such a timestamp is refused, not wrapped.
BOOST_AUTO_TEST_CASE(a_timestamp_out_of_system_clock_range_is_refused) {
  const auto max = std::numeric_limits<std::int64_t>::max();
  const auto min = std::numeric_limits<std::int64_t>::min();
  BOOST_TEST(!pg::binary::timestamptz(big_endian(static_cast<std::uint64_t>(max), 8)));
  BOOST_TEST(!pg::binary::timestamptz(big_endian(static_cast<std::uint64_t>(min), 8)));
  // 294276-12-31, the last day Postgres accepts.
  BOOST_TEST(!pg::binary::timestamptz(big_endian(9'224'318'015'999'999, 8)));
  Row row;
  row.expires_at = big_endian(static_cast<std::uint64_t>(max), 8);
  BOOST_TEST(!pg::decode_record(row.columns(), core::Sha256{}));
  // The last representable microsecond still decodes.
  const auto last = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::duration::max()) -
                    std::chrono::duration_cast<std::chrono::microseconds>(
                        pg::binary::kPostgresEpoch.time_since_epoch());
  BOOST_TEST(
      pg::binary::timestamptz(big_endian(static_cast<std::uint64_t>(last.count()), 8)).has_value());
}
