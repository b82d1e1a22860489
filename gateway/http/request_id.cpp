#include "gateway/http/request_id.hpp"

#include <sys/random.h>

#include <algorithm>
#include <boost/uuid/uuid.hpp>
#include <boost/uuid/uuid_io.hpp>
#include <cerrno>
#include <cstdint>
#include <system_error>

namespace idemgate::http {

namespace {

/// Random bytes for the calling thread's next ids, taken from the kernel 256 ids at a time.
class RandomPool {
 public:
  void take(unsigned char* out, std::size_t n) {
    if (used_ + n > sizeof bytes_) refill();
    std::copy_n(bytes_ + used_, n, out);
    used_ += n;
  }

 private:
  void refill() {
    std::size_t filled = 0;
    while (filled < sizeof bytes_) {
      const ssize_t got = ::getrandom(bytes_ + filled, sizeof bytes_ - filled, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "getrandom");
      }
      filled += static_cast<std::size_t>(got);
    }
    used_ = 0;
  }

  unsigned char bytes_[256 * 16];
  std::size_t used_ = sizeof bytes_;
};

}  // namespace

bool valid_request_id(std::string_view value) {
  return !value.empty() && value.size() <= kMaxRequestIdBytes &&
         std::all_of(value.begin(), value.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

void generate_request_id(char (&out)[kGeneratedRequestIdBytes]) {
  thread_local RandomPool pool;
  boost::uuids::uuid id;
  pool.take(id.data, id.size());
  id.data[6] = static_cast<std::uint8_t>((id.data[6] & 0x0f) | 0x40);  // version 4
  id.data[8] = static_cast<std::uint8_t>((id.data[8] & 0x3f) | 0x80);  // variant 10
  boost::uuids::to_chars(id, &out[0]);
}

std::string_view apply_request_id(boost::beast::http::fields& fields,
                                  const config::RequestId& config, std::string& storage) {
  const auto found = fields.find(config.header);
  if (found != fields.end() && valid_request_id(found->value()) &&
      fields.count(config.header) == 1) {
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
  fields.set(config.header, storage);
  return storage;
}

}  // namespace idemgate::http
