#pragma once
// Random bytes for everything that must not be guessed: lock owner tokens, request ids.

#include <cstddef>

namespace idemgate::common {

/// Fills `out[0..n)` from OpenSSL's CSPRNG. Each thread draws from its own buffer, refilled by
/// RAND_bytes in blocks of 4 KiB, so a request id or a lock token costs no system call (OpenSSL
/// checks getpid() on every RAND_bytes call) and no lock; bytes handed out are wiped from the
/// buffer. A fork discards every buffer: parent and child never share bytes. Requests larger
/// than a block go to RAND_bytes directly. Throws std::runtime_error when the generator fails.
/// Safe from any thread.
void random_bytes(unsigned char* out, std::size_t n);

}  // namespace idemgate::common
