#include "gateway/http/request_id.hpp"

#include <algorithm>
#include <boost/uuid/uuid.hpp>
#include <boost/uuid/uuid_io.hpp>
#include <cstdint>

#include "gateway/common/random.hpp"

namespace idemgate::http {

bool valid_request_id(std::string_view value) {
  return !value.empty() && value.size() <= kMaxRequestIdBytes &&
         std::all_of(value.begin(), value.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

void generate_request_id(char (&out)[kGeneratedRequestIdBytes]) {
  boost::uuids::uuid id{};
  common::random_bytes(id.data, id.size());
  id.data[6] = static_cast<std::uint8_t>((id.data[6] & 0x0f) | 0x40);  // version 4
  id.data[8] = static_cast<std::uint8_t>((id.data[8] & 0x3f) | 0x80);  // variant 10
  boost::uuids::to_chars(id, &out[0]);
}

std::string_view apply_request_id(boost::beast::http::fields& fields, const RequestId& config,
                                  std::string& storage) {
  AddedFields added;
  const std::string_view id = apply_request_id(fields, config, storage, added);
  added.insert_into(fields);
  return id;
}

std::string_view apply_request_id(boost::beast::http::fields& fields, const RequestId& config,
                                  std::string& storage, AddedFields& added) {
  // One pass: the first such field and whether there is another.
  const auto found = find_field(fields, config.header);
  if (found != fields.end() && valid_request_id(found->value()) &&
      find_next_field(fields, found) == fields.end()) {
    storage.assign(found->value().data(), found->value().size());
    return storage;
  }
  if (!config.generate) {
    storage.clear();
    return {};
  }
  char id[kGeneratedRequestIdBytes];
  generate_request_id(id);
  storage.assign(id, sizeof id);
  replace_field(fields, config.header, storage, added);
  return storage;
}

}  // namespace idemgate::http
