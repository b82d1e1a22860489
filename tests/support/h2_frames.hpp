#pragma once
// A raw HTTP/2 client for tests of the gateway's HTTP/2 codec (SPEC C49–C51): frames built by
// hand (RFC 9113 §4, §6) with literal HPACK fields (RFC 7541 §6.2, no Huffman coding), sent over
// a blocking loopback socket, and the frames the gateway sends back read one by one. What a real
// client refuses to send (hostile floods, connection-specific fields) is what it is for.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::test::h2 {

/// Frame types (RFC 9113 §6) and error codes (§7) the tests use.
enum Type : std::uint8_t {
  kData = 0,
  kHeaders = 1,
  kPriority = 2,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoaway = 7,
  kWindowUpdate = 8,
  kContinuation = 9,
};
enum Flag : std::uint8_t { kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4 };
enum ErrorCode : std::uint32_t {
  kNoError = 0,
  kProtocolError = 1,
  kCancel = 8,
  kRefusedStream = 7,
  kEnhanceYourCalm = 11,
};

using Fields = std::vector<std::pair<std::string, std::string>>;

/// One frame: the 9-octet header and the payload.
std::string frame(std::uint8_t type, std::uint8_t flags, std::uint32_t stream,
                  std::string_view payload);
/// The client preface and a SETTINGS frame with `settings` (id, value) pairs.
std::string preface(const std::vector<std::pair<std::uint16_t, std::uint32_t>>& settings = {});
/// `fields` as an HPACK block of literal fields without indexing, new names (RFC 7541 §6.2.2).
std::string header_block(const Fields& fields);
/// A request's fields: :method, :scheme http, :path, :authority, then `more`.
Fields request_fields(const std::string& method, const std::string& path, Fields more = {});
std::string headers(std::uint32_t stream, const Fields& fields, bool end_stream);
std::string data(std::uint32_t stream, std::string_view bytes, bool end_stream);
std::string rst_stream(std::uint32_t stream, std::uint32_t code);
std::string ping(std::uint64_t opaque);
std::string priority(std::uint32_t stream, std::uint32_t depends_on, std::uint8_t weight);

/// A received frame.
struct Frame {
  std::uint8_t type = 0;
  std::uint8_t flags = 0;
  std::uint32_t stream = 0;
  std::string payload;
  /// RST_STREAM's or GOAWAY's error code (0 for other frames).
  std::uint32_t error_code() const;
};

/// Takes the first whole frame off the front of `bytes` (nullopt: not all of it is there yet).
std::optional<Frame> take_frame(std::string& bytes);

/// What the gateway did with a connection, read until it ended or a deadline passed.
struct Ending {
  std::optional<std::uint32_t> goaway;  ///< the GOAWAY's error code, when one came
  bool closed = false;                  ///< the connection was closed (EOF or reset)
  std::size_t frames = 0;               ///< frames read meanwhile
};

/// A blocking HTTP/2 connection to 127.0.0.1:`port` (prior knowledge). Sends never block for
/// long: a send that cannot proceed within 5 s (the peer reads nothing) reports failure.
class Connection {
 public:
  explicit Connection(std::uint16_t port);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Writes `bytes`; false when the connection was closed or reset (or the send timed out).
  bool send(std::string_view bytes);
  /// The next frame within `timeout`; nullopt on timeout, EOF or reset (closed() then says).
  std::optional<Frame> read(std::chrono::milliseconds timeout);
  /// Reads frames until GOAWAY, the end of the connection, or `timeout`.
  Ending read_until_goaway(std::chrono::milliseconds timeout);
  /// Reads frames until one of `type` on `stream` arrives (nullopt: the connection ended or
  /// `timeout` passed first). SETTINGS are acknowledged on the way.
  std::optional<Frame> read_until(std::uint8_t type, std::uint32_t stream,
                                  std::chrono::milliseconds timeout);
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
  std::string in_;
};

}  // namespace idemgate::test::h2
