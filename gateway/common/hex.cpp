#include "gateway/common/hex.hpp"

namespace idemgate::common {

void hex_into(const unsigned char* data, std::size_t size, char* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0x0f];
  }
}

std::string hex(const unsigned char* data, std::size_t size) {
  std::string out(size * 2, '\0');
  hex_into(data, size, out.data());
  return out;
}

}  // namespace idemgate::common
