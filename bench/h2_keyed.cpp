// Keyed POST load over HTTP/2 with prior knowledge (S2 of scripts/bench over h2): every request
// carries an Idempotency-Key no other request had, on streams multiplexed over a few
// connections. h2load sends one header block on every request, so it cannot do this; this client
// builds each request itself on libnghttp2.
//
//   h2_keyed --port P [--host 127.0.0.1] [--threads 2] [--connections 8] [--streams 16]
//            [--seconds 8] [--run TOKEN] [--path /payments] [--authority localhost]
//
// --connections are spread over --threads (one poll loop each); each connection keeps --streams
// requests in flight, a new one submitted as soon as one ends, until --seconds have passed; the
// requests in flight then finish (at most 10 s more). Keys are `TOKEN-thread-connection-counter`
// and the body is a payment-service payment whose ids are the key, as bench/wrk.lua's keyed mode
// sends (the same key always carries the same body).
//
// Prints one line in bench/wrk.lua's form:
// `RESULT requests=… seconds=… rps=… p50_ms=… p99_ms=… p999_ms=… socket_errors=… non2xx3xx=…
// s2xx=… s409=… sother=…`: requests answered (those in flight at the end included) over the
// seconds from the start to the last answer; socket_errors: requests lost with their connection.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench/tool_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  sockaddr_in address{};
  int streams = 16;
  std::string run = "h2";
  std::string path = "/payments";
  std::string authority = "localhost";
  Clock::time_point deadline;
  Clock::time_point give_up;  // the requests still in flight are abandoned
};

struct Counts {
  long long requests = 0;
  long long socket_errors = 0;
  long long s2xx = 0;
  long long s409 = 0;
  long long sother = 0;
  std::vector<double> latency_ms;
  Clock::time_point last_answer;
};

struct Request {
  Clock::time_point start;
  std::string body;
  std::size_t body_sent = 0;
  int status = 0;
};

struct Connection {
  const Options* options = nullptr;
  Counts* counts = nullptr;
  std::string key_prefix;
  long long counter = 0;
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::unordered_map<std::int32_t, std::unique_ptr<Request>> in_flight;
  std::string out;  // bytes the session produced that the socket has not taken yet
  std::size_t out_off = 0;
  bool dead = false;

  ~Connection() {
    if (session != nullptr) nghttp2_session_del(session);
    if (fd >= 0) ::close(fd);
  }
};

std::string payment(const std::string& key) {
  return R"({"order_id":")" + key + R"(","customer_id":"c-1","provider":"bench",)" +
         R"("external_payment_id":")" + key + R"(","amount":"10.00"})";
}

nghttp2_nv field(std::string_view name, std::string_view value) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
          value.size(), NGHTTP2_NV_FLAG_NONE};
}

ssize_t read_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                  std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* r = static_cast<Request*>(source->ptr);
  const std::size_t n = std::min(length, r->body.size() - r->body_sent);
  std::memcpy(buf, r->body.data() + r->body_sent, n);
  r->body_sent += n;
  if (r->body_sent == r->body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

// Submits one keyed POST; nghttp2 copies the fields, the body stays with the Request.
bool submit(Connection& c) {
  auto r = std::make_unique<Request>();
  const std::string key = c.key_prefix + std::to_string(++c.counter);
  r->body = payment(key);
  const std::string length = std::to_string(r->body.size());
  const nghttp2_nv fields[] = {
      field(":method", "POST"),
      field(":scheme", "http"),
      field(":path", c.options->path),
      field(":authority", c.options->authority),
      field("content-type", "application/json"),
      field("content-length", length),
      field("idempotency-key", key),
  };
  nghttp2_data_provider body{};
  body.source.ptr = r.get();
  body.read_callback = read_body;
  r->start = Clock::now();
  const std::int32_t id = nghttp2_submit_request(c.session, nullptr, fields,
                                                 sizeof fields / sizeof fields[0], &body, nullptr);
  if (id < 0) return false;
  c.in_flight.emplace(id, std::move(r));
  return true;
}

int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
              std::size_t namelen, const std::uint8_t* value, std::size_t valuelen, std::uint8_t,
              void* user_data) {
  auto& c = *static_cast<Connection*>(user_data);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  if (std::string_view(reinterpret_cast<const char*>(name), namelen) != ":status") return 0;
  const auto it = c.in_flight.find(frame->hd.stream_id);
  if (it == c.in_flight.end()) return 0;
  int status = 0;
  for (std::size_t i = 0; i < valuelen; ++i) status = status * 10 + (value[i] - '0');
  it->second->status = status;
  return 0;
}

int on_stream_close(nghttp2_session*, std::int32_t id, std::uint32_t, void* user_data) {
  auto& c = *static_cast<Connection*>(user_data);
  const auto it = c.in_flight.find(id);
  if (it == c.in_flight.end()) return 0;
  const Request& r = *it->second;
  const auto now = Clock::now();
  Counts& n = *c.counts;
  ++n.requests;
  n.last_answer = now;
  n.latency_ms.push_back(std::chrono::duration<double, std::milli>(now - r.start).count());
  if (r.status >= 200 && r.status < 300) {
    ++n.s2xx;
  } else if (r.status == 409) {
    ++n.s409;
  } else {
    ++n.sother;
  }
  c.in_flight.erase(it);
  if (now < c.options->deadline && !submit(c)) return NGHTTP2_ERR_CALLBACK_FAILURE;
  return 0;
}

bool open_connection(Connection& c, nghttp2_session_callbacks* callbacks) {
  c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c.fd < 0 || ::connect(c.fd, reinterpret_cast<const sockaddr*>(&c.options->address),
                            sizeof c.options->address) != 0) {
    return false;
  }
  const int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (nghttp2_session_client_new(&c.session, callbacks, &c) != 0) return false;
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
  nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, settings, 1);
  for (int i = 0; i < c.options->streams; ++i) {
    if (!submit(c)) return false;
  }
  return true;
}

void lose(Connection& c) {
  if (c.dead) return;
  c.dead = true;
  c.counts->socket_errors += static_cast<long long>(c.in_flight.size());
  c.in_flight.clear();
}

// Moves what the session has to send into the socket, as far as it takes it.
void flush(Connection& c) {
  for (;;) {
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
      const std::uint8_t* data = nullptr;
      ssize_t n;
      while ((n = nghttp2_session_mem_send(c.session, &data)) > 0) {
        c.out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
        if (c.out.size() >= 64 * 1024) break;
      }
      if (n < 0) return lose(c);
      if (c.out.empty()) return;
    }
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      return lose(c);
    }
    c.out_off += static_cast<std::size_t>(n);
  }
}

void receive(Connection& c) {
  std::uint8_t buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (nghttp2_session_mem_recv(c.session, buf, static_cast<std::size_t>(n)) < 0) {
        return lose(c);
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    return lose(c);  // closed or reset
  }
}

void work(const Options& options, int thread, int connections, Counts& counts) {
  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < connections; ++i) {
    auto c = std::make_unique<Connection>();
    c->options = &options;
    c->counts = &counts;
    c->key_prefix = options.run + "-" + std::to_string(thread) + "-" + std::to_string(i) + "-";
    if (!open_connection(*c, callbacks)) {
      std::fprintf(stderr, "h2_keyed: connection %d of thread %d failed: %s\n", i, thread,
                   std::strerror(errno));
      lose(*c);
    } else {
      ::fcntl(c->fd, F_SETFL, ::fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    }
    conns.push_back(std::move(c));
  }
  std::vector<pollfd> polls;
  std::vector<Connection*> polled;
  for (;;) {
    const auto now = Clock::now();
    if (now >= options.give_up) {
      for (auto& c : conns) lose(*c);
      break;
    }
    polls.clear();
    polled.clear();
    for (auto& c : conns) {
      if (c->dead) continue;
      flush(*c);
      if (c->dead || (now >= options.deadline && c->in_flight.empty())) continue;
      const bool pending = c->out_off < c->out.size();
      polls.push_back({c->fd, static_cast<short>(POLLIN | (pending ? POLLOUT : 0)), 0});
      polled.push_back(c.get());
    }
    if (polls.empty()) break;
    ::poll(polls.data(), polls.size(), 50);
    for (std::size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].revents & (POLLIN | POLLERR | POLLHUP)) receive(*polled[i]);
    }
  }
  nghttp2_session_callbacks_del(callbacks);
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  int threads = 2;
  int connections = 8;
  double seconds = 8;
  Options options;
  po::options_description description("h2_keyed");
  description.add_options()("host", po::value(&host))("port", po::value(&port)->required())(
      "threads", po::value(&threads))("connections", po::value(&connections))(
      "streams", po::value(&options.streams))("seconds", po::value(&seconds))(
      "run", po::value(&options.run))("path", po::value(&options.path))(
      "authority", po::value(&options.authority));
  if (!idemgate::bench::parse_options(argc, argv, description)) return 2;
  if (threads < 1 || connections < threads || options.streams < 1) {
    std::fprintf(stderr,
                 "h2_keyed: need --threads ≥ 1, --connections ≥ --threads, --streams ≥ 1\n");
    return 2;
  }
  options.address.sin_family = AF_INET;
  options.address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &options.address.sin_addr) != 1) {
    std::fprintf(stderr, "h2_keyed: --host: not an IPv4 address: %s\n", host.c_str());
    return 2;
  }

  const auto start = Clock::now();
  options.deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  options.give_up = options.deadline + std::chrono::seconds(10);
  std::vector<Counts> counts(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    const int mine = connections / threads + (t < connections % threads ? 1 : 0);
    workers.emplace_back(work, std::cref(options), t, mine,
                         std::ref(counts[static_cast<std::size_t>(t)]));
  }
  for (auto& w : workers) w.join();

  Counts total;
  total.last_answer = start;
  for (const auto& n : counts) {
    total.requests += n.requests;
    total.socket_errors += n.socket_errors;
    total.s2xx += n.s2xx;
    total.s409 += n.s409;
    total.sother += n.sother;
    total.latency_ms.insert(total.latency_ms.end(), n.latency_ms.begin(), n.latency_ms.end());
    total.last_answer = std::max(total.last_answer, n.last_answer);
  }
  const double elapsed = std::chrono::duration<double>(total.last_answer - start).count();
  std::printf(
      "RESULT requests=%lld seconds=%.2f rps=%.0f p50_ms=%.2f p99_ms=%.2f p999_ms=%.2f "
      "socket_errors=%lld non2xx3xx=%lld s2xx=%lld s409=%lld sother=%lld\n",
      total.requests, elapsed, elapsed > 0 ? static_cast<double>(total.requests) / elapsed : 0.0,
      idemgate::bench::percentile(total.latency_ms, 0.50),
      idemgate::bench::percentile(total.latency_ms, 0.99),
      idemgate::bench::percentile(total.latency_ms, 0.999), total.socket_errors,
      total.s409 + total.sother, total.s2xx, total.s409, total.sother);
  return total.requests > 0 ? 0 : 1;
}
