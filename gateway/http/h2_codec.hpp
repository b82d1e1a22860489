#pragma once
// The HTTP/2 server side without I/O (SPEC C49–C51): libnghttp2 plus the gateway's stream glue.
// Bytes the client sent go in (receive), frames to send come out (send); each stream becomes one
// request for the connection that drives the codec (gateway/http/h2_session.hpp) to answer. The
// bounds of C51 live here, so that the fuzz target (fuzz/h2_frames_fuzzer.cpp) and the unit
// tests reach them without sockets.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gateway/http/handler.hpp"
#include "gateway/http/request_rules.hpp"
#include "gateway/http/settings.hpp"

struct nghttp2_session;

namespace idemgate::http {

/// The client connection preface (RFC 9113 §3.4).
inline constexpr std::string_view kH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a cleartext connection say about it (SPEC C49, prior knowledge).
enum class PrefaceMatch {
  http1,  ///< not the HTTP/2 preface: the connection speaks HTTP/1.1
  h2,     ///< the whole preface: the connection speaks HTTP/2
  more,   ///< a proper beginning of the preface: more bytes decide
};
PrefaceMatch match_h2_preface(std::string_view first_bytes);

/// The bounds of SPEC C51 and C50 that are not config keys (conf/REFERENCE.md, "HTTP/2").
namespace h2_bounds {
/// Frames that cost work without carrying a request (PING, SETTINGS, PRIORITY, RST_STREAM,
/// empty or padding-only DATA, WINDOW_UPDATE under kSmallWindowUpdate bytes) are paid from a
/// budget of kFloodBurst frames per connection that refills at kFloodRate a second.
inline constexpr double kFloodBurst = 1000;
inline constexpr double kFloodRate = 100;
inline constexpr std::int32_t kSmallWindowUpdate = 1024;
/// A header list that decodes to more than kHeaderBombFactor × max_header_bytes (HPACK bomb).
inline constexpr std::size_t kHeaderBombFactor = 4;
/// Bytes read with no request header or body byte in them and no answer byte sent: frames of
/// types the codec skips unseen, or any other filler.
inline constexpr std::size_t kFillerBytes = 1024 * 1024;
/// Request bodies: a stream's body gets flow-control window beyond the initial kStreamWindow
/// bytes only once the stream is admitted, oldest first, while the admitted streams' bodies
/// (their Content-Length, else max_request_body) fit in kHeldBodiesFactor × max_request_body;
/// one stream is always admitted, so uploads never wait on each other for ever.
inline constexpr std::size_t kHeldBodiesFactor = 4;
inline constexpr std::uint32_t kStreamWindow = 16 * 1024;
/// Rapid Reset (CVE-2023-44487): more than kRunningFactor × h2_max_concurrent_streams requests
/// still being answered (their streams reset by the client while the work goes on).
inline constexpr std::size_t kRunningFactor = 2;
}  // namespace h2_bounds

/// One request stream: what the client sent, then what it gets. The codec fills the request
/// fields and the flags; the connection fills the answer and the access-line fields.
struct H2Stream {
  using Clock = std::chrono::steady_clock;
  std::int32_t id = 0;
  Clock::time_point started;
  std::shared_ptr<const ProxyConfig> config;  ///< the snapshot the stream began on
  Request request;  ///< regular fields and body as received; see assemble_request()
  std::string method;
  std::string path;
  std::string authority;
  std::string cookie;  ///< `cookie` fields joined (RFC 9113 §8.2.3)
  /// The header list counted as its HTTP/1.1 lines would be (`name: value` CRLF), so that one
  /// limit means the same over both protocols (C04, C50).
  std::size_t header_bytes = 0;
  bool header_too_large = false;
  Clock::time_point last_progress;  ///< the last time its request's header or body moved
  bool admitted = false;            ///< its body gets window (h2_bounds::kHeldBodiesFactor)
  bool waiting = false;             ///< in the queue of bodies to admit
  std::size_t reserved = 0;         ///< bytes reserved for its body while admitted
  std::size_t window_owed = 0;      ///< DATA received before admission, window not given back
  bool body_too_large = false;
  /// The body follows the request to the upstream as it arrives (C50): the stream was handed
  /// out at its header, and `upload` holds what came and was not taken yet (take_body()).
  bool streaming = false;
  std::string upload;
  std::uint64_t upload_total = 0;  ///< body bytes received so far (max_streamed_body)
  bool upload_done = false;        ///< the body has ended (END_STREAM)
  bool upload_too_large = false;   ///< it passed max_streamed_body: the stream was reset
  bool upload_discarded = false;   ///< answered before it ended: the rest is read and dropped
  bool framed = false;             ///< DATA frames or a content-length came: the body is framed
  bool answering = false;          ///< the request is whole (or refused): its answer is under way
  bool submitted = false;          ///< the response header went to the codec
  bool closed = false;             ///< the codec closed the stream (done, or reset by either side)
  std::uint32_t close_error = 0;   ///< the RFC 9113 §7 error code it closed with
  // The response body: held whole, or the next piece of one that follows (C39).
  std::string out;
  std::size_t out_sent = 0;
  bool out_eof = true;
  bool deferred = false;  ///< the codec waits for more of `out`
  // The access line (C32), written once the stream has ended.
  bool logged = false;
  const Route* route = nullptr;
  unsigned status = 0;
  std::string outcome;
  std::string key_hash;
  std::string request_id;
  std::string trace_id;
  std::chrono::microseconds upstream_time{0};
  std::string cut;  ///< why the answer was cut short; empty when it was not
};

/// Makes `stream.request` the HTTP/1.1-shaped request the handler takes: method, target,
/// `:authority` as Host, joined cookies, Content-Length of a framed body. Returns the answer
/// for a request refused before routing: 431 past max_header_bytes, 413 past max_request_body
/// (C04), 400 for a head that check_request_head() refuses (C03); nullopt when it may be routed.
std::optional<Rejection> assemble_request(H2Stream& stream);

/// The reasons the codec ends a connection for passing a C51 bound (H2Events::calmed): the
/// labels of idemgate_h2_connections_ended_total it reports. (The connection adds
/// `zero_window`, a peer that reads nothing.)
inline constexpr std::string_view kCalmReasons[] = {"continuation_flood", "flood", "header_bomb",
                                                    "rapid_reset"};

/// What a codec tells the connection that drives it. Called from inside receive(), send() and
/// the codec's other calls; a callback must not call receive() or send().
class H2Events {
 public:
  virtual ~H2Events() = default;
  /// A stream's request is whole, or refused before it was (431, 413): answer it with submit()
  /// and call finished() once its handler is done, whatever became of the stream.
  virtual void request_ready(std::shared_ptr<H2Stream> stream) = 0;
  /// The codec closed the stream: its answer was sent, or either side reset it.
  virtual void stream_closed(H2Stream& stream) = 0;
  /// The codec took all of `stream.out` there was, or waits for more: the next piece may come.
  virtual void piece_taken(H2Stream& stream) = 0;
  /// A C51 bound was passed; the codec ends the connection with GOAWAY ENHANCE_YOUR_CALM.
  /// `reason` (one of kCalmReasons) is the label of idemgate_h2_connections_ended_total, `why`
  /// one sentence.
  virtual void calmed(std::string_view reason, std::string_view why) = 0;
  /// There are frames to send.
  virtual void wants_write() = 0;
  /// Asked once a request's header has come and its body is still to come: true hands the
  /// stream out at once (request_ready), its body then following through take_body() as it
  /// arrives (C50); false holds the body until it ends (bounded by max_request_body).
  virtual bool streams_body(H2Stream& /*stream*/) { return false; }
  /// Body bytes, its end, or a reset came for a streaming stream.
  virtual void body_arrived(H2Stream& /*stream*/) {}
};

/// One HTTP/2 server connection's codec state (RFC 9113), without I/O.
///
/// - SETTINGS: `MAX_CONCURRENT_STREAMS` = `limits.h2_max_concurrent_streams` (streams past it
///   are refused with REFUSED_STREAM), `MAX_HEADER_LIST_SIZE` = `limits.max_header_bytes`,
///   `INITIAL_WINDOW_SIZE` = h2_bounds::kStreamWindow.
/// - RFC 9113 §8 messaging (pseudo-header fields, connection-specific fields, `TE` other than
///   `trailers`, a `content-length` that disagrees with the DATA) is checked by libnghttp2: a
///   stream error PROTOCOL_ERROR; nothing becomes a request.
/// - Each stream's config snapshot is `snapshot()` at its first HEADERS frame.
class H2Codec {
 public:
  using Clock = std::chrono::steady_clock;
  using Snapshot = std::function<std::shared_ptr<const ProxyConfig>()>;

  /// Limits come from `snapshot()` at construction (the connection's) and at each stream's
  /// beginning (the stream's). Throws std::runtime_error when libnghttp2 cannot make a session.
  H2Codec(Snapshot snapshot, H2Events& events);
  ~H2Codec();
  H2Codec(const H2Codec&) = delete;
  H2Codec& operator=(const H2Codec&) = delete;

  /// Takes bytes the client sent (the preface first). False when the connection is to end
  /// without more reading: a connection error (error() says which, GOAWAY is queued) or a C51
  /// bound passed (calm()).
  bool receive(const void* data, std::size_t size);
  /// Appends frames to send to `out` until it holds at least `batch` bytes or nothing is left.
  /// False on a fatal codec error (nothing more can be sent).
  bool send(std::string& out, std::size_t batch);
  /// A write of what send() gave made progress: the client's next frames may be windows.
  void wrote() { filler_bytes_ = 0; }
  bool want_read() const;
  bool want_write() const;
  /// The codec's reason for the last failed receive().
  const std::string& error() const { return error_; }
  /// True once a C51 bound was passed.
  bool calm() const { return calm_; }

  /// Answers `stream` with `res` (fields already final): its body held whole, or, `streamed`,
  /// following in pieces through `stream.out` (more()). HEAD and bodiless statuses send none.
  void submit(H2Stream& stream, Response& res, bool head, bool streamed);
  /// The next piece of a streamed body is in `stream.out` (`out_eof` on the last).
  void more(H2Stream& stream);
  /// Resets `stream` with `error_code` (RFC 9113 §7).
  void reset(H2Stream& stream, std::uint32_t error_code);
  /// Moves what a streaming stream's body has brought into `piece` and gives the client that
  /// much window again (flow control is the backpressure: at most kStreamWindow bytes wait).
  void take_body(H2Stream& stream, std::string& piece);
  /// The handler of a request_ready() stream is done: its body's reservation is free.
  void finished(H2Stream& stream);
  /// Server stop: GOAWAY with the last stream id served; open streams go on.
  void drain();
  /// An idle connection: GOAWAY NO_ERROR, the connection ends once no stream is left.
  void end();
  /// No more bounds are reported (the connection is gone).
  void stop() { stopped_ = true; }
  /// C07 per stream: resets (CANCEL) every stream whose request stopped arriving `idle` before
  /// `now`. Returns how many.
  std::size_t reset_stalled(Clock::time_point now, Clock::duration idle);
  /// Whether a stream has answer bytes ready that the client's window holds back (C51's
  /// zero-window reader).
  bool answers_held() const;

  /// Requests handed out by request_ready() whose finished() has not come.
  std::size_t running() const { return running_; }
  /// Bytes reserved by admitted request bodies (≤ kHeldBodiesFactor × max_request_body).
  std::size_t held_bodies() const { return admitted_bytes_; }
  /// The open streams, by id.
  const std::unordered_map<std::int32_t, std::shared_ptr<H2Stream>>& streams() const {
    return streams_;
  }
  const Limits& limits() const { return config_->limits; }

  struct Callbacks;  ///< libnghttp2's callbacks (h2_codec.cpp)

 private:
  H2Stream* stream_of(std::int32_t id) const;
  void start(H2Stream& stream);
  void admit();
  void release(H2Stream& stream);
  /// GOAWAY ENHANCE_YOUR_CALM naming `last_stream` (default: the last stream processed).
  void calm_down(std::string_view reason, std::string_view why,
                 std::optional<std::int32_t> last_stream = std::nullopt);
  bool pay_flood();

  Snapshot snapshot_;
  H2Events& events_;
  std::shared_ptr<const ProxyConfig> config_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<H2Stream>> streams_;
  std::string error_;
  bool calm_ = false;
  bool stopped_ = false;
  std::size_t running_ = 0;
  double flood_tokens_ = h2_bounds::kFloodBurst;
  Clock::time_point flood_refilled_ = Clock::now();
  std::size_t filler_bytes_ = 0;
  std::size_t admitted_bytes_ = 0;
  std::deque<std::shared_ptr<H2Stream>> body_queue_;
};

}  // namespace idemgate::http
