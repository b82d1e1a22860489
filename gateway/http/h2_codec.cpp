#include "gateway/http/h2_codec.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <boost/beast/http/error.hpp>
#include <cctype>
#include <charconv>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "gateway/http/headers.hpp"

namespace idemgate::http {

namespace bhttp = boost::beast::http;
using namespace h2_bounds;

PrefaceMatch match_h2_preface(std::string_view first_bytes) {
  const std::size_t n = std::min(first_bytes.size(), kH2Preface.size());
  if (first_bytes.substr(0, n) != kH2Preface.substr(0, n)) return PrefaceMatch::http1;
  return n == kH2Preface.size() ? PrefaceMatch::h2 : PrefaceMatch::more;
}

std::optional<Rejection> assemble_request(H2Stream& s) {
  const auto& limits = s.config->limits;
  Request& req = s.request;
  req.version(11);
  req.method_string(s.method);
  req.target(s.path);
  if (!s.authority.empty()) req.set(bhttp::field::host, s.authority);
  if (!s.cookie.empty()) req.set(bhttp::field::cookie, s.cookie);
  if (s.header_too_large) return rejection_for(bhttp::error::header_limit, limits);
  if (s.body_too_large) return rejection_for(bhttp::error::body_limit, limits);
  if (s.framed && !req.has_content_length()) req.content_length(req.body().size());
  return check_request_head(req.base(), false);  // Host, absolute-form (C03)
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

nghttp2_nv make_nv(const std::string& name, std::string_view value) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
          value.size(), NGHTTP2_NV_FLAG_NONE};
}

}  // namespace

struct H2Codec::Callbacks {
  static H2Codec& of(void* user_data) { return *static_cast<H2Codec*>(user_data); }

  static int on_begin_headers(nghttp2_session* session, const nghttp2_frame* frame,
                              void* user_data) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    H2Codec& self = of(user_data);
    // Rapid Reset (CVE-2023-44487): a client keeps within MAX_CONCURRENT_STREAMS by resetting
    // the streams it opened while their work goes on; more running than it may have open is
    // that. A client that cancels a stream may open another at once while the first one's
    // handler winds down: kRunningFactor × the limit leaves it that much room.
    // The stream is not served: GOAWAY names the stream before it as the last one (RFC 9113
    // §6.8), so that the client knows this one never ran; no state is kept for it.
    if (self.running_ >= kRunningFactor * self.limits().h2_max_concurrent_streams) {
      self.calm_down("rapid_reset",
                     "more streams in progress than h2_max_concurrent_streams (reset early)",
                     std::max(frame->hd.stream_id - 2, 0));
      return 0;
    }
    auto s = std::make_shared<H2Stream>();
    s->id = frame->hd.stream_id;
    s->started = Clock::now();
    s->last_progress = s->started;
    s->config = self.snapshot_();
    s->request.version(11);
    nghttp2_session_set_stream_user_data(session, s->id, s.get());
    self.streams_.insert_or_assign(s->id, std::move(s));
    return 0;
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
                       std::size_t namelen, const std::uint8_t* value, std::size_t valuelen,
                       std::uint8_t, void* user_data) {
    H2Codec& self = of(user_data);
    H2Stream* s = self.stream_of(frame->hd.stream_id);
    // Trailer fields are not forwarded: the header stays as it arrived (as over HTTP/1.1).
    if (!s || s->answering || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    const std::size_t max_header = s->config->limits.max_header_bytes;
    s->header_bytes += namelen + valuelen + 4;
    if (s->header_bytes > max_header) s->header_too_large = true;
    if (s->header_bytes > kHeaderBombFactor * max_header) {
      self.calm_down("header_bomb", "a header list decoded past " +
                                        std::to_string(kHeaderBombFactor) +
                                        " x max_header_bytes (HPACK bomb)");
      return NGHTTP2_ERR_PAUSE;
    }
    if (s->header_too_large) return 0;
    if (n == ":method") {
      s->method.assign(v);
    } else if (n == ":path") {
      s->path.assign(v);
    } else if (n == ":authority") {
      s->authority.assign(v);
    } else if (n.starts_with(':')) {
      // :scheme (checked by the codec), :protocol (no extended CONNECT is offered)
    } else if (n == "cookie") {
      if (!s->cookie.empty()) s->cookie += "; ";
      s->cookie.append(v);
    } else {
      if (n == "content-length") s->framed = true;
      s->request.insert(n, v);
    }
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
    H2Codec& self = of(user_data);
    const bool costly =
        frame->hd.type == NGHTTP2_PING || frame->hd.type == NGHTTP2_PRIORITY ||
        frame->hd.type == NGHTTP2_RST_STREAM ||
        (frame->hd.type == NGHTTP2_SETTINGS && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) ||
        (frame->hd.type == NGHTTP2_DATA && frame->hd.length <= frame->data.padlen &&
         (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) ||
        // data dribble (CVE-2019-9511): windows opened a few bytes at a time
        (frame->hd.type == NGHTTP2_WINDOW_UPDATE &&
         frame->window_update.window_size_increment < kSmallWindowUpdate);
    if (costly && !self.pay_flood()) {
      self.calm_down("flood",
                     "more PING, SETTINGS, PRIORITY, RST_STREAM or empty DATA frames than " +
                         std::to_string(static_cast<int>(kFloodRate)) + " a second");
      return 0;
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS) self.filler_bytes_ = 0;
    H2Stream* s = self.stream_of(frame->hd.stream_id);
    if (!s) return 0;
    const bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (s->streaming) {
      if (end_stream) {
        s->upload_done = true;
        self.events_.body_arrived(*s);
      }
      return 0;
    }
    if (s->answering) return 0;
    // A header list past the limit is answered at once (431): its body is not needed.
    if (end_stream || s->header_too_large) {
      self.start(*s);
    } else if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
               self.events_.streams_body(*s)) {
      s->streaming = true;
      // C50: a streamed body may have stream_buffer bytes on the way (the window), no more.
      const auto window = static_cast<std::int32_t>(std::min<std::size_t>(
          std::max<std::size_t>(s->config->limits.stream_buffer, kStreamWindow), INT32_MAX));
      nghttp2_session_set_local_window_size(self.session_, NGHTTP2_FLAG_NONE, s->id, window);
      self.start(*s);
    }
    return 0;
  }

  static int on_data_chunk(nghttp2_session* session, std::uint8_t, std::int32_t stream_id,
                           const std::uint8_t* data, std::size_t len, void* user_data) {
    H2Codec& self = of(user_data);
    // The connection's window is always given back: only streams wait for theirs.
    nghttp2_session_consume_connection(session, len);
    H2Stream* s = self.stream_of(stream_id);
    if (s && s->streaming && (s->upload_discarded || s->upload_too_large)) {
      nghttp2_session_consume_stream(session, stream_id, len);
      return 0;
    }
    if (s && s->streaming) {
      // Held until the upstream takes it; the stream's window is given back then (C50).
      s->upload.append(reinterpret_cast<const char*>(data), len);
      s->upload_total += len;
      s->last_progress = Clock::now();
      self.filler_bytes_ = 0;
      const std::size_t max = s->config->limits.max_streamed_body;
      if (max > 0 && s->upload_total > max) {
        s->upload_too_large = true;
        s->upload.clear();
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
        self.events_.wants_write();
      }
      self.events_.body_arrived(*s);
      return 0;
    }
    if (!s || s->answering) {  // answered early: the rest is read and dropped
      nghttp2_session_consume_stream(session, stream_id, len);
      return 0;
    }
    s->framed = true;
    s->last_progress = Clock::now();
    auto& body = s->request.body();
    if (body.size() + len > s->config->limits.max_request_body) {
      s->body_too_large = true;  // C04: 413 before the body ends; nothing is forwarded
      nghttp2_session_consume_stream(session, stream_id, len);
      self.start(*s);
      return 0;
    }
    body.append(reinterpret_cast<const char*>(data), len);
    self.filler_bytes_ = 0;
    if (s->admitted) {
      nghttp2_session_consume_stream(session, stream_id, len);
      return 0;
    }
    s->window_owed += len;
    if (!s->waiting) {
      s->waiting = true;
      const auto it = self.streams_.find(stream_id);
      if (it != self.streams_.end()) self.body_queue_.push_back(it->second);
    }
    self.admit();
    return 0;
  }

  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code,
                             void* user_data) {
    H2Codec& self = of(user_data);
    const auto it = self.streams_.find(stream_id);
    if (it == self.streams_.end()) return 0;
    const std::shared_ptr<H2Stream> s = std::move(it->second);
    self.streams_.erase(it);
    s->closed = true;
    s->close_error = error_code;
    if (!s->answering) self.release(*s);  // reset before its request was whole
    self.events_.stream_closed(*s);
    if (s->streaming) self.events_.body_arrived(*s);
    return 0;
  }

  static int on_frame_send(nghttp2_session* session, const nghttp2_frame* frame, void* user_data) {
    H2Codec& self = of(user_data);
    if ((frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) ||
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
      return 0;
    }
    // The whole answer went out before the whole body came in (C47): the body is not needed.
    // RFC 9113 §8.1 lets the server ask for that with RST_STREAM NO_ERROR, but curl 7.88 then
    // spins without end; the rest is read and dropped instead, as over HTTP/1.1.
    H2Stream* s = self.stream_of(frame->hd.stream_id);
    if (s && s->streaming && !s->upload_done && !s->upload_discarded) {
      s->upload_discarded = true;
      if (!s->upload.empty()) {
        nghttp2_session_consume_stream(session, s->id, s->upload.size());
        s->upload.clear();
      }
      self.events_.body_arrived(*s);
      self.events_.wants_write();
    }
    return 0;
  }

  static ssize_t read_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                           std::uint32_t* data_flags, nghttp2_data_source* source,
                           void* user_data) {
    H2Codec& self = of(user_data);
    auto& s = *static_cast<H2Stream*>(source->ptr);
    const std::size_t available = s.out.size() - s.out_sent;
    if (available == 0 && !s.out_eof) {
      s.deferred = true;
      self.events_.piece_taken(s);
      return NGHTTP2_ERR_DEFERRED;
    }
    const std::size_t n = std::min(length, available);
    if (n > 0) std::memcpy(buf, s.out.data() + s.out_sent, n);
    s.out_sent += n;
    if (s.out_sent == s.out.size()) {
      if (s.out_eof) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
      } else {
        self.events_.piece_taken(s);  // room for the next piece
      }
    }
    return static_cast<ssize_t>(n);
  }
};

H2Codec::H2Codec(Snapshot snapshot, H2Events& events)
    : snapshot_(std::move(snapshot)), events_(events), config_(snapshot_()) {
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) {
    throw std::runtime_error("libnghttp2: out of memory");
  }
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, &Callbacks::on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &Callbacks::on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &Callbacks::on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &Callbacks::on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &Callbacks::on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, &Callbacks::on_frame_send);
  nghttp2_option* option = nullptr;
  if (nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(callbacks);
    throw std::runtime_error("libnghttp2: out of memory");
  }
  // A SETTINGS frame with more entries than this ends the connection (CVE-2019-9515 sends many).
  nghttp2_option_set_max_settings(option, 32);
  // Flow control is ours: DATA is given back to the window once its memory is free (release()).
  nghttp2_option_set_no_auto_window_update(option, 1);
  const int rv = nghttp2_session_server_new2(&session_, callbacks, this, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) {
    session_ = nullptr;
    throw std::runtime_error(std::string("libnghttp2: ") + nghttp2_strerror(rv));
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
       static_cast<std::uint32_t>(limits().h2_max_concurrent_streams)},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
       static_cast<std::uint32_t>(std::min<std::size_t>(limits().max_header_bytes, UINT32_MAX))},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
}

H2Codec::~H2Codec() {
  if (session_) nghttp2_session_del(session_);
}

H2Stream* H2Codec::stream_of(std::int32_t id) const {
  return static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session_, id));
}

bool H2Codec::receive(const void* data, std::size_t size) {
  filler_bytes_ += size;
  const auto rv = nghttp2_session_mem_recv(session_, static_cast<const std::uint8_t*>(data), size);
  if (rv < 0) {
    error_ = nghttp2_strerror(static_cast<int>(rv));
    // libnghttp2 gives up on these without a GOAWAY of its own; C51 wants the peer told.
    if (rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) {
      calm_down("continuation_flood",
                "more CONTINUATION frames in one header block than libnghttp2 accepts");
    } else if (rv == NGHTTP2_ERR_FLOODED) {
      calm_down("flood",
                "more frames queued for a peer that does not read them than "
                "libnghttp2 accepts");
    } else if (!calm_ && !stopped_) {
      nghttp2_session_terminate_session(session_, NGHTTP2_PROTOCOL_ERROR);
      events_.wants_write();
    }
    return false;
  }
  if (filler_bytes_ > kFillerBytes) {
    calm_down("flood", "more than 1 MiB read without a request byte in it");
  }
  return !calm_;
}

bool H2Codec::send(std::string& out, std::size_t batch) {
  while (out.size() < batch) {
    const std::uint8_t* data = nullptr;
    const auto n = nghttp2_session_mem_send(session_, &data);
    if (n < 0) return false;
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
  }
  return true;
}

bool H2Codec::want_read() const {
  return nghttp2_session_want_read(session_) != 0;
}
bool H2Codec::want_write() const {
  return nghttp2_session_want_write(session_) != 0;
}

void H2Codec::start(H2Stream& s) {
  s.answering = true;
  const auto it = streams_.find(s.id);
  if (it == streams_.end()) return;
  ++running_;
  events_.request_ready(it->second);
}

void H2Codec::admit() {
  const std::size_t bound = kHeldBodiesFactor * std::max<std::size_t>(limits().max_request_body, 1);
  while (!body_queue_.empty()) {
    H2Stream& s = *body_queue_.front();
    if (s.closed || s.answering || s.admitted) {
      body_queue_.pop_front();
      continue;
    }
    const auto field = s.request[bhttp::field::content_length];
    const std::string_view length(field.data(), field.size());
    std::size_t need = s.config->limits.max_request_body;
    if (!length.empty()) {
      std::size_t declared = 0;
      const auto [end, ec] =
          std::from_chars(length.data(), length.data() + length.size(), declared);
      if (ec == std::errc() && end == length.data() + length.size()) {
        need = std::min(need, declared);
      }
    }
    if (admitted_bytes_ > 0 && admitted_bytes_ + need > bound) break;  // one is always admitted
    admitted_bytes_ += need;
    s.reserved = need;
    s.admitted = true;
    s.waiting = false;
    if (s.window_owed > 0) {
      nghttp2_session_consume_stream(session_, s.id, s.window_owed);
      s.window_owed = 0;
      events_.wants_write();
    }
    body_queue_.pop_front();
  }
}

void H2Codec::release(H2Stream& s) {
  if (!s.admitted) return;
  s.admitted = false;
  admitted_bytes_ -= std::min(admitted_bytes_, s.reserved);
  s.reserved = 0;
  admit();
}

void H2Codec::take_body(H2Stream& s, std::string& piece) {
  piece.clear();
  piece.swap(s.upload);
  if (!piece.empty() && !s.closed) {
    nghttp2_session_consume_stream(session_, s.id, piece.size());
    events_.wants_write();
  }
}

void H2Codec::finished(H2Stream& s) {
  release(s);  // the request and its body are gone with the handler's frame
  if (running_ > 0) --running_;
}

void H2Codec::submit(H2Stream& s, Response& res, bool head, bool streamed) {
  std::vector<std::string> names;
  names.reserve(std::distance(res.begin(), res.end()));
  std::vector<nghttp2_nv> nva;
  nva.reserve(names.capacity() + 1);
  static const std::string status_name = ":status";
  const std::string status = std::to_string(res.result_int());
  nva.push_back(make_nv(status_name, status));
  for (const auto& field : res) {
    names.push_back(lower(field.name_string()));
    nva.push_back(make_nv(names.back(), field.value()));
  }
  const bool has_body =
      !head && status_has_body(res.result_int()) && (streamed || !res.body().empty());
  nghttp2_data_provider provider{};
  if (has_body) {
    s.out = std::move(res.body());
    s.out_sent = 0;
    s.out_eof = !streamed;
    provider.source.ptr = &s;
    provider.read_callback = &Callbacks::read_body;
  }
  const int rv = nghttp2_submit_response(session_, s.id, nva.data(), nva.size(),
                                         has_body ? &provider : nullptr);
  if (rv != 0) {
    s.cut = std::string("submitting the response failed: ") + nghttp2_strerror(rv);
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
  }
  s.submitted = true;
  events_.wants_write();
}

void H2Codec::more(H2Stream& s) {
  if (s.deferred) {
    s.deferred = false;
    nghttp2_session_resume_data(session_, s.id);
  }
  events_.wants_write();
}

void H2Codec::reset(H2Stream& s, std::uint32_t error_code) {
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, error_code);
  events_.wants_write();
}

void H2Codec::drain() {
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
  events_.wants_write();
}

void H2Codec::end() {
  nghttp2_session_terminate_session(session_, NGHTTP2_NO_ERROR);
  events_.wants_write();
}

std::size_t H2Codec::reset_stalled(Clock::time_point now, Clock::duration idle) {
  std::size_t n = 0;
  for (const auto& [id, s] : streams_) {
    if (!s->answering && now >= s->last_progress + idle) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
      ++n;
    }
  }
  if (n > 0) events_.wants_write();
  return n;
}

bool H2Codec::answers_held() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const auto& entry) {
    const H2Stream& s = *entry.second;
    return s.submitted && !s.closed && !s.deferred;
  });
}

bool H2Codec::pay_flood() {
  const auto now = Clock::now();
  flood_tokens_ = std::min(
      kFloodBurst,
      flood_tokens_ + kFloodRate * std::chrono::duration<double>(now - flood_refilled_).count());
  flood_refilled_ = now;
  flood_tokens_ -= 1;
  return flood_tokens_ >= 0;
}

void H2Codec::calm_down(std::string_view reason, std::string_view why,
                        std::optional<std::int32_t> last_stream) {
  if (calm_ || stopped_) return;
  calm_ = true;
  events_.calmed(reason, why);
  if (last_stream) {
    nghttp2_session_terminate_session2(session_, *last_stream, NGHTTP2_ENHANCE_YOUR_CALM);
  } else {
    nghttp2_session_terminate_session(session_, NGHTTP2_ENHANCE_YOUR_CALM);
  }
  events_.wants_write();
}

}  // namespace idemgate::http
