#pragma once
// Random bytes for everything that must not be guessed: lock owner tokens, request ids.

#include <cstddef>

namespace idemgate::common {

/// Fills `out[0..n)` from OpenSSL's CSPRNG (a per-thread DRBG: no lock on the request path).
/// Throws std::runtime_error when the generator fails. Safe from any thread.
void random_bytes(unsigned char* out, std::size_t n);

}  // namespace idemgate::common
