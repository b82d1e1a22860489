#pragma once
// One connection's byte stream, plain TCP or TLS over TCP, behind one non-template type, so that
// the streaming relay and the upgrade tunnel (SPEC C38, C40) are written once for the four
// pairings of client and upstream connections. It models Asio's AsyncReadStream and
// AsyncWriteStream (Beast's http::async_read/async_write accept it) and forwards each operation
// to the stream underneath without wrapping the completion handler.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/system/error_code.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <utility>

#include <sys/socket.h>
#include <sys/uio.h>

#include "gateway/common/use_nothrow.hpp"

namespace idemgate::http {

using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;

/// A non-owning view of a plain or TLS connection. Timeouts are set on tcp() (Beast's
/// tcp_stream expiry covers the TLS layer's reads and writes too). Copyable; the streams it
/// points to must outlive every copy.
class ByteStream {
 public:
  using executor_type = boost::asio::any_io_executor;

  explicit ByteStream(boost::beast::tcp_stream& plain) : tcp_(&plain) {}
  explicit ByteStream(TlsStream& tls) : tcp_(&boost::beast::get_lowest_layer(tls)), tls_(&tls) {}

  executor_type get_executor() { return tcp_->get_executor(); }
  /// The TCP layer: expiry (timeouts), close, the socket.
  boost::beast::tcp_stream& tcp() { return *tcp_; }
  bool is_tls() const { return tls_ != nullptr; }
  /// The next operation's deadline (beast::get_lowest_layer of a ByteStream is itself).
  void expires_after(std::chrono::steady_clock::duration d) { tcp_->expires_after(d); }

  /// Writes what the connection takes at once, without waiting: a plain connection whose send
  /// buffer has room takes a whole response in one `sendmsg`, with no asynchronous operation,
  /// timer or handler behind it. Returns the bytes written: 0 for a TLS connection (not tried)
  /// and when the send buffer is full. Only when no write is pending on the connection; `error`
  /// is set when the connection failed (the caller's next write then fails too).
  template <class ConstBufferSequence>
  std::size_t write_now(const ConstBufferSequence& buffers, boost::system::error_code& error) {
    error = {};
    if (tls_) return 0;
    constexpr std::size_t kMaxPieces = 16;
    iovec pieces[kMaxPieces];
    std::size_t count = 0;
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers) && count < kMaxPieces; ++it) {
      const boost::asio::const_buffer piece(*it);
      if (piece.size() == 0) continue;
      pieces[count].iov_base = const_cast<void*>(piece.data());
      pieces[count].iov_len = piece.size();
      ++count;
    }
    if (count == 0) return 0;
    msghdr message{};
    message.msg_iov = pieces;
    message.msg_iovlen = count;
    const ssize_t n =
        ::sendmsg(tcp_->socket().native_handle(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      error.assign(errno, boost::system::system_category());
    }
    return 0;
  }

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const MutableBufferSequence& b) {
          if (tls_) {
            tls_->async_read_some(b, std::move(handler));
          } else {
            tcp_->async_read_some(b, std::move(handler));
          }
        },
        token, buffers);
  }

  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const ConstBufferSequence& b) {
          if (tls_) {
            tls_->async_write_some(b, std::move(handler));
          } else {
            tcp_->async_write_some(b, std::move(handler));
          }
        },
        token, buffers);
  }

 private:
  boost::beast::tcp_stream* tcp_;
  TlsStream* tls_ = nullptr;
};

/// Writes what ByteStream::write_now() left of `buffers` (its first `sent` bytes went), within
/// the stream's expiry. The buffers must stay valid until the awaitable completes.
template <class ConstBufferSequence>
boost::asio::awaitable<boost::system::error_code> write_rest(ByteStream stream,
                                                             const ConstBufferSequence& buffers,
                                                             std::size_t sent) {
  boost::beast::buffers_suffix<ConstBufferSequence> rest(buffers);
  rest.consume(sent);
  auto [ec, n] = co_await boost::asio::async_write(stream, rest, common::use_nothrow);
  co_return ec;
}

}  // namespace idemgate::http
