#include "tests/support/h2_frames.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <system_error>

namespace idemgate::test::h2 {

namespace {

void put32(std::string& out, std::uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

std::uint32_t get32(std::string_view in) {
  return (static_cast<std::uint32_t>(static_cast<unsigned char>(in[0])) << 24) |
         (static_cast<std::uint32_t>(static_cast<unsigned char>(in[1])) << 16) |
         (static_cast<std::uint32_t>(static_cast<unsigned char>(in[2])) << 8) |
         static_cast<std::uint32_t>(static_cast<unsigned char>(in[3]));
}

/// An HPACK integer with a 7-bit prefix (RFC 7541 §5.1), the H bit clear: a string length.
void put_length(std::string& out, std::size_t n) {
  if (n < 127) {
    out.push_back(static_cast<char>(n));
    return;
  }
  out.push_back(static_cast<char>(127));
  n -= 127;
  while (n >= 128) {
    out.push_back(static_cast<char>((n % 128) | 128));
    n /= 128;
  }
  out.push_back(static_cast<char>(n));
}

}  // namespace

std::string frame(std::uint8_t type, std::uint8_t flags, std::uint32_t stream,
                  std::string_view payload) {
  std::string out;
  const auto length = static_cast<std::uint32_t>(payload.size());
  out.push_back(static_cast<char>(length >> 16));
  out.push_back(static_cast<char>(length >> 8));
  out.push_back(static_cast<char>(length));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  put32(out, stream & 0x7fffffffU);
  out.append(payload);
  return out;
}

std::string preface(const std::vector<std::pair<std::uint16_t, std::uint32_t>>& settings) {
  std::string payload;
  for (const auto& [id, value] : settings) {
    payload.push_back(static_cast<char>(id >> 8));
    payload.push_back(static_cast<char>(id));
    put32(payload, value);
  }
  return "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(kSettings, 0, 0, payload);
}

std::string header_block(const Fields& fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    out.push_back(0);  // literal without indexing, new name
    put_length(out, name.size());
    out += name;
    put_length(out, value.size());
    out += value;
  }
  return out;
}

Fields request_fields(const std::string& method, const std::string& path, Fields more) {
  Fields out = {
      {":method", method}, {":scheme", "http"}, {":path", path}, {":authority", "gateway.test"}};
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::string headers(std::uint32_t stream, const Fields& fields, bool end_stream) {
  return frame(kHeaders, kEndHeaders | (end_stream ? kEndStream : 0), stream, header_block(fields));
}

std::string data(std::uint32_t stream, std::string_view bytes, bool end_stream) {
  return frame(kData, end_stream ? kEndStream : 0, stream, bytes);
}

std::string rst_stream(std::uint32_t stream, std::uint32_t code) {
  std::string payload;
  put32(payload, code);
  return frame(kRstStream, 0, stream, payload);
}

std::string ping(std::uint64_t opaque) {
  std::string payload;
  put32(payload, static_cast<std::uint32_t>(opaque >> 32));
  put32(payload, static_cast<std::uint32_t>(opaque));
  return frame(kPing, 0, 0, payload);
}

std::string priority(std::uint32_t stream, std::uint32_t depends_on, std::uint8_t weight) {
  std::string payload;
  put32(payload, depends_on);
  payload.push_back(static_cast<char>(weight));
  return frame(kPriority, 0, stream, payload);
}

std::uint32_t Frame::error_code() const {
  if (type == kRstStream && payload.size() >= 4) return get32(payload);
  if (type == kGoaway && payload.size() >= 8) return get32(std::string_view(payload).substr(4));
  return 0;
}

std::optional<Frame> take_frame(std::string& bytes) {
  if (bytes.size() < 9) return std::nullopt;
  const std::size_t length =
      (static_cast<std::size_t>(static_cast<unsigned char>(bytes[0])) << 16) |
      (static_cast<std::size_t>(static_cast<unsigned char>(bytes[1])) << 8) |
      static_cast<std::size_t>(static_cast<unsigned char>(bytes[2]));
  if (bytes.size() < 9 + length) return std::nullopt;
  Frame f;
  f.type = static_cast<std::uint8_t>(bytes[3]);
  f.flags = static_cast<std::uint8_t>(bytes[4]);
  f.stream = get32(std::string_view(bytes).substr(5)) & 0x7fffffffU;
  f.payload = bytes.substr(9, length);
  bytes.erase(0, 9 + length);
  return f;
}

Connection::Connection(std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    ::close(fd_);
    throw std::system_error(e, std::generic_category(), "connect");
  }
  timeval send_timeout{5, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

bool Connection::send(std::string_view bytes) {
  while (!bytes.empty()) {
    const auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::optional<Frame> Connection::read(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto f = take_frame(in_)) return f;
    if (closed_) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready <= 0) continue;
    char buf[16384];
    const auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed_ = true;
      continue;
    }
    in_.append(buf, static_cast<std::size_t>(n));
  }
}

Ending Connection::read_until_goaway(std::chrono::milliseconds timeout) {
  Ending out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto f = read(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!f) break;
    ++out.frames;
    if (f->type == kGoaway) {
      out.goaway = f->error_code();
      break;
    }
  }
  out.closed = closed_;
  return out;
}

std::optional<Frame> Connection::read_until(std::uint8_t type, std::uint32_t stream,
                                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto f = read(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!f) return std::nullopt;
    if (f->type == kSettings && (f->flags & kAck) == 0) send(frame(kSettings, kAck, 0, ""));
    if (f->type == type && f->stream == stream) return f;
  }
  return std::nullopt;
}

}  // namespace idemgate::test::h2
