#define BOOST_TEST_MODULE redis_auth_scale_e2e_test
// A Redis that lets only an ACL user limited to the lock keys in, restarted while keyed requests
// run: every connection the gateway opens again must authenticate before its first lock command
// (SPEC C25: the gateway reconnects by itself; storage.redis.username).

#include <hiredis/hiredis.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/gateway_fixture.hpp"
#include "tests/fault/local_stores.hpp"
#include "tests/support/process.hpp"

namespace {

using namespace std::chrono_literals;
using namespace idemgate::test;
using namespace idemgate::test::e2e;
using Clock = std::chrono::steady_clock;

const std::string kUser = "idemgate";
const std::string kSecret = "acl-secret";
const std::string kAdminSecret = "admin-secret";

/// One redis-server on a fixed free loopback port: the default user is off, `idemgate` may run
/// only what the lock needs on `idemgate:lock:*` (conf/REFERENCE.md lists it), `admin` may do
/// anything (for the test's looks).
class AclRedis {
 public:
  AclRedis() : port_(free_port()) { start(); }
  ~AclRedis() {
    if (process_) process_->stop();
  }

  std::uint16_t port() const { return port_; }

  void start() {
    ChildOptions options;
    options.executable = "/usr/bin/redis-server";
    options.args = {"--port", std::to_string(port_), "--bind", kLoopback, "--save", "",
                    "--appendonly", "no", "--dir", dir_.path().string(),
                    // Directives on the command line: each --user is one ACL rule line.
                    "--user", "default", "off", "--user", kUser, "on", ">" + kSecret,
                    "~idemgate:lock:*", "+set", "+get", "+eval", "+evalsha", "+pexpire", "+del",
                    "+ping", "+config|get", "+client|id", "+client|kill", "--user", "admin", "on",
                    ">" + kAdminSecret, "~*", "+@all"};
    options.stdout_path = (dir_.path() / "redis.log").string();
    options.stderr_path = (dir_.path() / "redis.err").string();
    process_.emplace(options);
    if (!wait_for_port(kLoopback, port_, kEventDeadline, &*process_)) {
      throw std::runtime_error(
          "redis-server did not start: " + read_text_file(options.stdout_path) +
          read_text_file(options.stderr_path));
    }
  }

  void stop() {
    process_->stop();
    process_.reset();
  }

  /// `ACL LOG` as the admin: one entry per refused AUTH or denied command since start.
  std::size_t acl_log_entries() const {
    const timeval timeout{5, 0};
    redisContext* c = redisConnectWithTimeout(kLoopback.c_str(), port_, timeout);
    BOOST_REQUIRE(c != nullptr && c->err == 0);
    auto* auth = static_cast<redisReply*>(
        redisCommand(c, "AUTH admin %b", kAdminSecret.data(), kAdminSecret.size()));
    BOOST_REQUIRE(auth != nullptr && auth->type == REDIS_REPLY_STATUS);
    freeReplyObject(auth);
    auto* log = static_cast<redisReply*>(redisCommand(c, "ACL LOG"));
    BOOST_REQUIRE(log != nullptr && log->type == REDIS_REPLY_ARRAY);
    const std::size_t n = log->elements;
    freeReplyObject(log);
    redisFree(c);
    return n;
  }

 private:
  TempDir dir_;
  std::uint16_t port_;
  std::optional<ChildProcess> process_;
};

std::string single_route(const std::string& name) {
  return "  - name: " + name +
         "\n"
         "    match: { path_prefix: /payments, methods: [POST] }\n"
         "    upstream: payments\n"
         "    idempotency:\n"
         "      mode: required\n"
         "      methods: [POST]\n";
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_acl_user_reauthenticates_on_every_reconnect_after_a_restart_under_load) {
  idemgate::test::fault::LocalStores stores;  // Postgres for the records and the payments
  AclRedis redis;
  PaymentService payments;
  GatewayConfig config;
  config.upstreams = {{"payments", {payments.address()}}};
  config.routes_yaml = single_route("acl-restart");
  config.redis = "address: " + kLoopback + ", port: " + std::to_string(redis.port()) +
                 ", username: " + kUser + ", password: " + kSecret;
  config.redis_operation_timeout = "300ms";
  Gateway gateway(config);

  // Keyed requests, each with a new key, from 4 clients until told to stop.
  std::atomic<bool> done{false};
  std::atomic<Clock::time_point::rep> restarted_at{0};
  std::mutex mutex;
  std::map<unsigned, int> statuses;
  int executed_after_restart = 0;
  std::vector<std::string> errors;
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&] {
      while (!done.load()) {
        const auto request =
            keyed_post("/payments", unique_name("acl"), payment_body(unique_name("pay-acl")));
        try {
          const auto response = http_request(kLoopback, gateway.port(), request, kEventDeadline);
          const std::lock_guard lock(mutex);
          ++statuses[response.status];
          const auto since = restarted_at.load();
          if (response.status == 201 && since != 0 &&
              Clock::now().time_since_epoch().count() > since) {
            ++executed_after_restart;
          }
        } catch (const std::exception& e) {
          const std::lock_guard lock(mutex);
          errors.emplace_back(e.what());
        }
      }
    });
  }
  struct Join {
    std::atomic<bool>& done;
    std::vector<std::thread>& threads;
    ~Join() {
      done = true;
      for (auto& t : threads) t.join();
    }
  } join{done, clients};

  // Each phase waits for what it needs to see, kEventDeadline being only a safety net: keyed
  // requests executing, then a request that met the stopped Redis, then 20 executions after the
  // restart.
  const auto wait_until = [&](const std::function<bool()>& seen) {
    const auto deadline = Clock::now() + kEventDeadline;
    for (;;) {
      {
        const std::lock_guard lock(mutex);
        if (seen()) return;
      }
      if (Clock::now() > deadline) return;
      std::this_thread::sleep_for(20ms);
    }
  };
  wait_until([&] { return statuses[201] >= 20; });
  redis.stop();
  wait_until([&] { return statuses[503] > 0; });
  redis.start();
  restarted_at = Clock::now().time_since_epoch().count();
  wait_until([&] { return executed_after_restart >= 20; });
  done = true;
  for (auto& t : clients) t.join();
  clients.clear();

  const std::lock_guard lock(mutex);
  BOOST_TEST(errors.empty(), "requests without an answer: " << errors.size() << ", first: "
                                                            << (errors.empty() ? "" : errors[0]));
  BOOST_TEST(executed_after_restart >= 20,
             "keyed requests executed after the restart: " << executed_after_restart << "\n"
                                                           << gateway.diagnostics());
  int answered = 0;
  for (const auto& [status, n] : statuses) {
    BOOST_TEST((status == 201 || status == 503), "status " << status << " × " << n);
    answered += n;
  }
  BOOST_TEST(statuses[503] > 0, "the restart was seen by no request (" << answered << " answered)");
  // A 503 never reached the upstream (C25): every payment belongs to a 201.
  BOOST_TEST(payments.counter("payments_inserted") == static_cast<std::uint64_t>(statuses[201]));
  // Every connection authenticated before its first command: nothing was refused or denied.
  BOOST_TEST(redis.acl_log_entries() == 0u);
  const std::string log = gateway.stderr_text();
  BOOST_TEST(log.find("NOAUTH") == std::string::npos, gateway.diagnostics());
  BOOST_TEST(log.find("NOPERM") == std::string::npos, gateway.diagnostics());
  BOOST_TEST_MESSAGE("answers: 201 × "
                     << statuses[201] << ", 503 × " << statuses[503]
                     << "; executed after the restart: " << executed_after_restart);
}
