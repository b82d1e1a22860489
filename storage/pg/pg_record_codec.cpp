#include "storage/pg/pg_record_codec.hpp"

#include <algorithm>
#include <utility>

#include "storage/pg/pg_binary.hpp"

namespace idemgate::storage::pg {
namespace {

constexpr char kHeadersFormat = 1;

void append_length(std::string& out, std::size_t length) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((length >> shift) & 0xff));
  }
}

std::optional<std::string_view> take_field(std::string_view& in) {
  if (in.size() < 4) return std::nullopt;
  std::size_t length = 0;
  for (int i = 0; i < 4; ++i) length = (length << 8) | static_cast<unsigned char>(in[i]);
  in.remove_prefix(4);
  if (in.size() < length) return std::nullopt;
  const auto field = in.substr(0, length);
  in.remove_prefix(length);
  return field;
}

template <class Decode>
auto decode_column(const std::optional<std::string_view>& column, Decode decode)
    -> decltype(decode(std::string_view())) {
  if (!column) return std::nullopt;
  return decode(*column);
}

}  // namespace

std::string encode_headers(const std::vector<core::HeaderField>& headers) {
  std::size_t size = 1;
  for (const auto& [name, value] : headers) size += 8 + name.size() + value.size();
  std::string out;
  out.reserve(size);
  out.push_back(kHeadersFormat);
  for (const auto& [name, value] : headers) {
    append_length(out, name.size());
    out += name;
    append_length(out, value.size());
    out += value;
  }
  return out;
}

std::optional<std::vector<core::HeaderField>> decode_headers(std::string_view in) {
  if (in.empty() || in[0] != kHeadersFormat) return std::nullopt;
  in.remove_prefix(1);
  std::vector<core::HeaderField> headers;
  while (!in.empty()) {
    const auto name = take_field(in);
    if (!name) return std::nullopt;
    const auto value = take_field(in);
    if (!value) return std::nullopt;
    headers.emplace_back(std::string(*name), std::string(*value));
  }
  return headers;
}

std::optional<core::StoredRecord> decode_record(const RecordColumns& row, const core::Sha256& id) {
  core::StoredRecord record;
  record.id = id;
  record.route = std::string(row.route.value_or(std::string_view()));
  const auto fingerprint = row.fingerprint.value_or(std::string_view());
  const auto status = decode_column(row.status, binary::int4);
  auto headers = decode_headers(row.headers.value_or(std::string_view()));
  const auto omitted = decode_column(row.body_omitted, binary::boolean);
  const auto created = decode_column(row.created_at, binary::timestamptz);
  const auto expires = decode_column(row.expires_at, binary::timestamptz);
  if (fingerprint.size() != record.fingerprint.size() || !status || *status < 100 ||
      *status > 599 || !headers || !omitted || !created || !expires) {
    return std::nullopt;
  }
  std::copy(fingerprint.begin(), fingerprint.end(), record.fingerprint.begin());
  record.response.status = static_cast<std::uint16_t>(*status);
  record.response.headers = std::move(*headers);
  record.response.body = std::string(row.body.value_or(std::string_view()));
  record.response.body_omitted = *omitted;
  record.created_at = *created;
  record.expires_at = *expires;
  return record;
}

}  // namespace idemgate::storage::pg
