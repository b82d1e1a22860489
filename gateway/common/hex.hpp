#pragma once
// Lower-case hexadecimal text of bytes (record ids, lock tokens, request ids).

#include <cstddef>
#include <string>

namespace idemgate::common {

/// Writes the 2 * `size` lower-case hex digits of `data[0..size)` to `out`.
void hex_into(const unsigned char* data, std::size_t size, char* out);

/// The lower-case hex of `data[0..size)` (2 * `size` characters).
std::string hex(const unsigned char* data, std::size_t size);

}  // namespace idemgate::common
