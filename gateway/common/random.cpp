#include "gateway/common/random.hpp"

#include <openssl/rand.h>
#include <stdexcept>

namespace idemgate::common {

void random_bytes(unsigned char* out, std::size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) throw std::runtime_error("RAND_bytes failed");
}

}  // namespace idemgate::common
