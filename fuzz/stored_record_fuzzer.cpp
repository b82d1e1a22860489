// Fuzz target for decoding a stored record (storage/pg/pg_record_codec.hpp, SPEC C16, C29): the
// row a Postgres server returns for a key, possibly written by another gateway version or
// damaged. The input is the row's eight columns separated by '\x1f' (route, fingerprint, status,
// headers, body, body_omitted, created_at, expires_at, in binary format); a column that is
// exactly "\x00N" stands for SQL NULL. Missing columns are NULL, extra separators stay in the
// last column. Every row either decodes to a record that replays what the columns say, or is
// refused; and the header blob alone round-trips through encode_headers.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/check.hpp"
#include "storage/pg/pg_binary.hpp"
#include "storage/pg/pg_record_codec.hpp"

namespace core = idemgate::core;
namespace pg = idemgate::storage::pg;
using idemgate::fuzz::check;

namespace {

constexpr char kSeparator = '\x1f';
constexpr std::string_view kNull("\0N", 2);

/// Checks decode_headers on `blob` and on its prefixes that cut it inside a field.
void check_header_blob(std::string_view blob) {
  const auto headers = pg::decode_headers(blob);
  if (!headers) return;
  // A blob that decodes is the one encoding of its fields.
  check(pg::encode_headers(*headers) == blob, "a decoded header blob re-encodes to itself");
  // Cuts: inside a field the blob is refused; at a field boundary it is the fields before it.
  std::size_t at = 1;
  std::size_t whole = 0;
  for (const auto& [name, value] : *headers) {
    const std::size_t field_end = at + 8 + name.size() + value.size();
    for (const std::size_t cut :
         {at + 1, at + 4, at + 4 + name.size(), at + 7 + name.size(), field_end - 1}) {
      if (cut <= at || cut >= field_end) continue;
      check(!pg::decode_headers(blob.substr(0, cut)), "a blob cut inside a field is refused");
    }
    ++whole;
    const auto prefix = pg::decode_headers(blob.substr(0, field_end));
    check(prefix && prefix->size() == whole, "a blob cut after a field holds the fields before");
    at = field_end;
  }
  check(at == blob.size(), "the fields cover the blob");
  check(!pg::decode_headers(blob.substr(0, 0)), "an empty blob is refused");
}

/// Round trip of headers built from the input: encode then decode gives the same list.
void check_round_trip(std::string_view input) {
  std::vector<std::string_view> parts;
  idemgate::fuzz::split(input, kSeparator, parts);
  std::vector<core::HeaderField> headers;
  for (std::size_t i = 0; i + 1 < parts.size(); i += 2) {
    headers.emplace_back(std::string(parts[i]), std::string(parts[i + 1]));
  }
  const std::string blob = pg::encode_headers(headers);
  const auto decoded = pg::decode_headers(blob);
  check(decoded && *decoded == headers, "encode_headers then decode_headers is the identity");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> columns;
  idemgate::fuzz::split(input, kSeparator, columns);
  if (columns.size() > 8) {
    // Extra separators belong to the last column.
    const auto start = static_cast<std::size_t>(columns[7].data() - input.data());
    columns.resize(7);
    columns.push_back(input.substr(start));
  }
  std::optional<std::string_view> value[8];
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] != kNull) value[i] = columns[i];
  }
  pg::RecordColumns row{value[0], value[1], value[2], value[3],
                        value[4], value[5], value[6], value[7]};
  core::Sha256 id{};
  id[0] = 0x42;
  const auto record = pg::decode_record(row, id);
  if (row.headers) check_header_blob(*row.headers);
  check_round_trip(input);
  if (!record) return 0;

  // A decoded record replays exactly what the row holds.
  check(record->id == id, "the record keeps the id it was read for");
  check(record->route == row.route.value_or(""), "route is the column");
  check(row.fingerprint && row.fingerprint->size() == 32, "fingerprint is 32 bytes");
  check(std::string_view(reinterpret_cast<const char*>(record->fingerprint.data()), 32) ==
            *row.fingerprint,
        "fingerprint is the column");
  check(row.status && pg::binary::int4(*row.status) == record->response.status,
        "status is the int4 column");
  check(record->response.status >= 100 && record->response.status <= 599, "status is 100-599");
  check(row.headers && pg::decode_headers(*row.headers) == record->response.headers,
        "headers are the decoded blob");
  check(pg::encode_headers(record->response.headers) == *row.headers,
        "the headers re-encode to the stored blob");
  check(record->response.body == row.body.value_or(""), "body is the column");
  check(row.body_omitted && pg::binary::boolean(*row.body_omitted) == record->response.body_omitted,
        "body_omitted is the bool column");
  check(row.created_at && pg::binary::timestamptz(*row.created_at) == record->created_at,
        "created_at is the timestamptz column");
  check(row.expires_at && pg::binary::timestamptz(*row.expires_at) == record->expires_at,
        "expires_at is the timestamptz column");
  return 0;
}
