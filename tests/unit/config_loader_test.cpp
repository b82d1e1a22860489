#define BOOST_TEST_MODULE config_loader
#include <boost/test/unit_test.hpp>

#include "gateway/config/config_loader.hpp"
#include "tests/support/config_text.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace cfg = idemgate::config;
using namespace std::chrono_literals;

namespace {

std::filesystem::path source_dir() {
  const char* dir = std::getenv("IDEMGATE_SOURCE_DIR");
  BOOST_TEST_REQUIRE(dir != nullptr, "IDEMGATE_SOURCE_DIR is not set (ctest sets it)");
  return dir;
}

std::filesystem::path data_dir() {
  return source_dir() / "tests" / "data" / "config";
}

// Lines 1-11; a test appends keys under `idempotency:` (line 12 onwards) or replaces parts.
const std::string kBase = idemgate::test::kMinimalConfig +
                          "    idempotency:\n"       // 10
                          "      mode: required\n";  // 11

std::string with_idempotency(const std::string& lines) {
  return kBase + lines;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  BOOST_TEST_REQUIRE(at != std::string::npos, "test text lacks " << from);
  return text.replace(at, from.size(), to);
}

// The shared loader helpers (tests/support/config_text.hpp) under the names used here.
constexpr auto& load = idemgate::test::load_config_text;
constexpr auto& error_of = idemgate::test::config_error_of;

cfg::Idempotency idem_of(const std::string& text) {
  return cfg::contract_of(load(text)->routes.at(0)).idempotency;
}

bool has_warning(const cfg::Config& c, const std::string& text) {
  return std::any_of(c.warnings.begin(), c.warnings.end(),
                     [&](const std::string& w) { return w == text; });
}

// Run from the source directory so paths in messages stay repository-relative.
struct InSourceDir {
  InSourceDir() : previous(std::filesystem::current_path()) {
    std::filesystem::current_path(source_dir());
  }
  ~InSourceDir() { std::filesystem::current_path(previous); }
  std::filesystem::path previous;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(samples)

BOOST_AUTO_TEST_CASE(loads_spec_section2_example_with_its_values) {
  InSourceDir here;
  const auto c = cfg::load_config("tests/data/config/spec_example.yaml");
  BOOST_TEST(c->source_file == "tests/data/config/spec_example.yaml");
  BOOST_TEST(c->warnings.empty());
  BOOST_TEST(c->listen.address == "127.0.0.1");
  BOOST_TEST(c->listen.port == 8080);
  BOOST_TEST(c->listen.tls_cert.empty());
  BOOST_TEST(c->admin.port == 9090);
  BOOST_TEST(c->threads == 2);
  BOOST_TEST(c->limits.max_request_body == 1024u * 1024u);
  BOOST_TEST(c->limits.max_header_bytes == 8u * 1024u);
  BOOST_TEST(c->limits.header_read_timeout.count() == 10'000);
  BOOST_TEST(c->limits.idle_timeout.count() == 60'000);
  BOOST_TEST(c->limits.drain_timeout.count() == 30'000);
  BOOST_TEST(c->storage.postgres.dsn == "postgresql://idem@127.0.0.1:5432/idem");
  BOOST_TEST(c->storage.postgres.pool_size == 8);
  BOOST_TEST(c->storage.postgres.operation_timeout.count() == 2000);
  BOOST_TEST(c->storage.redis.address == "127.0.0.1");
  BOOST_TEST(c->storage.redis.port == 6379);
  BOOST_TEST(c->storage.redis.db == 0);
  BOOST_TEST(c->storage.redis.password.empty());
  BOOST_TEST(c->storage.redis.operation_timeout.count() == 500);
  BOOST_TEST(c->storage.cleanup.interval.count() == 600'000);
  BOOST_TEST(c->storage.cleanup.batch == 5000);

  BOOST_TEST_REQUIRE(c->upstreams.size() == 2u);
  const cfg::Upstream& pay = c->upstreams.at("payments");
  BOOST_TEST(pay.name == "payments");
  BOOST_TEST_REQUIRE(pay.servers.size() == 1u);
  BOOST_TEST(pay.servers[0].host == "127.0.0.1");
  BOOST_TEST(pay.servers[0].port == 9001);
  BOOST_TEST(pay.connect_timeout.count() == 1000);
  BOOST_TEST(pay.request_timeout.count() == 20'000);
  BOOST_TEST(pay.max_idle_connections == 64);
  BOOST_TEST(pay.idle_timeout.count() == 4000);
  BOOST_TEST(pay.max_response_body == 64u * 1024u * 1024u);
  const cfg::Upstream& legacy = c->upstreams.at("legacy");
  BOOST_TEST_REQUIRE(legacy.servers.size() == 2u);
  BOOST_TEST(legacy.servers[1].host == "::1");
  BOOST_TEST(legacy.servers[1].port == 9003);

  BOOST_TEST_REQUIRE(c->routes.size() == 2u);
  const cfg::Route& r = c->routes[0];
  BOOST_TEST(r.name == "payments");
  BOOST_TEST(r.match.path_prefix == "/payments");
  BOOST_TEST(r.match.path.empty());
  BOOST_TEST(r.match.methods == std::vector<std::string>{"POST"});
  BOOST_TEST(r.upstream == "payments");
  const cfg::Idempotency& i = cfg::contract_of(r).idempotency;
  BOOST_TEST((i.mode == cfg::IdempotencyMode::required));
  BOOST_TEST((i.methods == std::vector<std::string>{"POST", "PATCH"}));
  BOOST_TEST(i.ttl.count() == 48 * 3'600'000);
  BOOST_TEST(i.lock_ttl.count() == 30'000);
  BOOST_TEST(i.key_scope_headers == std::vector<std::string>{"Authorization"});
  BOOST_TEST(
      (i.fingerprint_headers == std::vector<std::string>{"Content-Type", "Content-Encoding"}));
  BOOST_TEST((i.upstream_key == cfg::UpstreamKey::passthrough));
  BOOST_TEST(i.upstream_key_secret.empty());
  BOOST_TEST((i.key_source.kind == cfg::KeySource::Kind::header));
  BOOST_TEST(i.key_source.header == "Idempotency-Key");
  BOOST_TEST(i.on_mismatch == 422);
  BOOST_TEST((i.concurrency == cfg::Concurrency::reject));
  BOOST_TEST(i.wait_timeout.count() == 10'000);
  BOOST_TEST(i.store_statuses.contains(201));
  BOOST_TEST(!i.store_statuses.contains(429));
  BOOST_TEST(i.max_stored_response == 8u * 1024u * 1024u);
  BOOST_TEST((i.on_unknown_outcome == cfg::UnknownOutcome::hold));
  BOOST_TEST((i.fingerprint_body == cfg::FingerprintBody::bytes));
  BOOST_TEST((i.on_store_error == cfg::StoreErrorPolicy::fail_closed));
  BOOST_TEST(c->routes[1].name == "legacy");
  BOOST_TEST((cfg::contract_of(c->routes[1]).idempotency.mode == cfg::IdempotencyMode::off));
}

BOOST_AUTO_TEST_CASE(applies_spec_defaults_when_keys_are_omitted) {
  const auto c = cfg::load_config((data_dir() / "minimal.yaml").string());
  const cfg::Config d;
  BOOST_TEST(c->listen.address == "127.0.0.1");
  BOOST_TEST(c->listen.port == 0);
  BOOST_TEST(c->admin.address == "127.0.0.1");
  BOOST_TEST(c->admin.port == 9090);
  BOOST_TEST(c->threads >= 1);
  BOOST_TEST(c->limits.max_request_body == 1024u * 1024u);
  BOOST_TEST(c->limits.max_header_bytes == 8u * 1024u);
  BOOST_TEST(c->limits.header_read_timeout.count() == 10'000);
  BOOST_TEST(c->storage.postgres.pool_size == 8);
  BOOST_TEST(c->storage.redis.address == "127.0.0.1");
  BOOST_TEST(c->storage.redis.port == 6379);
  BOOST_TEST(c->storage.redis.operation_timeout.count() == 500);
  BOOST_TEST(c->storage.cleanup.interval.count() == 600'000);
  BOOST_TEST(c->upstreams.at("app").servers.at(0).host == "localhost");
  BOOST_TEST(c->upstreams.at("app").request_timeout.count() == 20'000);

  const cfg::Idempotency& i = cfg::contract_of(c->routes.at(0)).idempotency;
  BOOST_TEST((i.mode == cfg::IdempotencyMode::off));
  BOOST_TEST((i.methods == std::vector<std::string>{"POST", "PATCH"}));
  BOOST_TEST(i.ttl.count() == 24 * 3'600'000);
  BOOST_TEST(i.lock_ttl.count() == 30'000);
  BOOST_TEST(i.key_scope_headers.empty());
  BOOST_TEST(
      (i.fingerprint_headers == std::vector<std::string>{"Content-Type", "Content-Encoding"}));
  BOOST_TEST(i.key_source.header == "Idempotency-Key");
  BOOST_TEST(i.on_mismatch == 422);
  BOOST_TEST((i.concurrency == cfg::Concurrency::reject));
  BOOST_TEST(i.wait_timeout.count() == 10'000);
  BOOST_TEST(i.commit_timeout.count() == 10'000);
  BOOST_TEST(i.max_stored_response == 8u * 1024u * 1024u);
  BOOST_TEST((i.on_unknown_outcome == cfg::UnknownOutcome::hold));
  BOOST_TEST((i.fingerprint_body == cfg::FingerprintBody::bytes));
  BOOST_TEST((i.upstream_key == cfg::UpstreamKey::passthrough));
  BOOST_TEST((i.on_store_error == cfg::StoreErrorPolicy::fail_closed));
  for (unsigned s = 100; s < 600; ++s) {
    BOOST_TEST(
        i.store_statuses.contains(s) == idemgate::core::StatusSet::default_storable().contains(s),
        "status " << s);
  }
}

BOOST_AUTO_TEST_CASE(threads_zero_resolves_to_hardware_cores_at_least_one) {
  const auto c = load(replace(kBase, "listen:", "threads: 0\nlisten:"));
  BOOST_TEST(c->threads == static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

BOOST_AUTO_TEST_CASE(spec_C14_rewrite_reads_secret_relative_to_the_config_file) {
  InSourceDir here;
  const auto c = cfg::load_config("tests/data/config/rewrite.yaml");
  const cfg::Route& r = c->routes.at(0);
  BOOST_TEST(r.match.path == "/hooks/stripe");
  BOOST_TEST(r.match.host == "*.example.com");
  BOOST_TEST((cfg::contract_of(r).idempotency.upstream_key == cfg::UpstreamKey::rewrite));
  BOOST_TEST(cfg::contract_of(r).idempotency.upstream_key_secret_file ==
             "tests/data/config/hmac.key");
  // The file's final newline is not part of the key.
  BOOST_TEST(cfg::contract_of(r).idempotency.upstream_key_secret ==
             "a-test-only-secret-of-forty-bytes-0123456");
  BOOST_TEST(c->warnings.empty());
}

// Each file under bad/ starts with `# expect: LINE: key: problem`.
BOOST_AUTO_TEST_CASE(bad_sample_files_fail_with_their_expected_file_line_key_problem) {
  InSourceDir here;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("tests/data/config/bad")) {
    const std::string file = "tests/data/config/bad/" + entry.path().filename().string();
    std::ifstream in(file);
    std::string first;
    std::getline(in, first);
    const std::string prefix = "# expect: ";
    BOOST_TEST_REQUIRE(first.rfind(prefix, 0) == 0u, file << " lacks an expect line");
    std::string got = "loaded";
    try {
      cfg::load_config(file);
    } catch (const cfg::ConfigError& e) {
      got = e.what();
    }
    BOOST_TEST(got == file + ":" + first.substr(prefix.size()));
    ++checked;
  }
  BOOST_TEST(checked >= 7);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors)

BOOST_AUTO_TEST_CASE(error_carries_file_line_key_and_problem_separately) {
  try {
    load(with_idempotency("      ttl: 30\n"));
    BOOST_FAIL("loaded");
  } catch (const cfg::ConfigError& e) {
    BOOST_TEST(e.file() == "t.yaml");
    BOOST_TEST(e.line() == 12);
    BOOST_TEST(e.key() == "routes[0].idempotency.ttl");
    BOOST_TEST(
        e.problem() ==
        "a bare number is not a duration: write the unit, e.g. \"30s\" (units: ms, s, m, h)");
  }
}

BOOST_AUTO_TEST_CASE(missing_file_is_reported_as_the_file) {
  InSourceDir here;
  BOOST_CHECK_EXCEPTION(cfg::load_config("tests/data/config/no-such.yaml"), cfg::ConfigError,
                        [](const cfg::ConfigError& e) {
                          return std::string(e.what()) ==
                                 "tests/data/config/no-such.yaml:1: (file): cannot read: No such "
                                 "file or directory";
                        });
}

BOOST_AUTO_TEST_CASE(a_config_path_that_is_not_a_regular_file_is_reported_as_the_file) {
  InSourceDir here;
  BOOST_CHECK_EXCEPTION(cfg::load_config("tests/data/config"), cfg::ConfigError,
                        [](const cfg::ConfigError& e) {
                          return std::string(e.what()) ==
                                 "tests/data/config:1: (file): cannot read: not a regular file";
                        });
}

BOOST_AUTO_TEST_CASE(files_named_by_keys_must_be_regular_files_of_the_right_kind) {
  InSourceDir here;
  // A directory, a device that never ends, a TLS file that is not PEM: each names its key.
  BOOST_TEST(error_of(with_idempotency("      upstream_key: rewrite\n"
                                       "      upstream_key_secret_file: tests/data\n")) ==
             "t.yaml:13: routes[0].idempotency.upstream_key_secret_file: \"tests/data\" is not a "
             "regular file");
  BOOST_TEST(error_of(with_idempotency("      upstream_key: rewrite\n"
                                       "      upstream_key_secret_file: /dev/zero\n")) ==
             "t.yaml:13: routes[0].idempotency.upstream_key_secret_file: \"/dev/zero\" is not a "
             "regular file");
  const auto tls = [&](const std::string& cert, const std::string& key) {
    return replace(kBase, "port: 0 }", "port: 0, tls: { cert: " + cert + ", key: " + key + " } }");
  };
  const std::string crt = "tests/data/config/tls/test.crt";
  const std::string key = "tests/data/config/tls/test.key";
  BOOST_TEST(load(tls(crt, key))->listen.tls_cert == crt);
  BOOST_TEST(error_of(tls("tests/data/config/hmac.key", key)) ==
             "t.yaml:1: listen.tls.cert: \"tests/data/config/hmac.key\" holds no PEM certificate");
  BOOST_TEST(error_of(tls(crt, crt)) ==
             "t.yaml:1: listen.tls.key: \"" + crt + "\" holds no unencrypted PEM private key");
  BOOST_TEST(error_of(tls(key, key)) ==
             "t.yaml:1: listen.tls.cert: \"" + key + "\" holds no PEM certificate");
}

BOOST_AUTO_TEST_CASE(yaml_syntax_error_names_its_line) {
  BOOST_TEST(error_of(kBase + "  - name: x\n   bad: [\n") ==
             "t.yaml:13: (syntax): end of sequence not found");
}

BOOST_AUTO_TEST_CASE(empty_document_and_non_mapping_root_are_rejected) {
  BOOST_TEST(error_of("# nothing\n") ==
             "t.yaml:1: (root): the document is empty; expected a mapping with listen, storage, "
             "upstreams, routes");
  BOOST_TEST(error_of("- a\n- b\n") == "t.yaml:1: (root): expected a mapping, got a list");
  BOOST_TEST(error_of(kBase + "---\nlisten: {}\n") ==
             "t.yaml:13: (root): expected one YAML document, found more");
}

BOOST_AUTO_TEST_CASE(unknown_keys_are_rejected_at_every_level) {
  BOOST_TEST(error_of(kBase + "lisen: {}\n") ==
             "t.yaml:12: lisen: unknown key (expected one of: listen, admin, threads, limits, "
             "request_id, storage, upstreams, routes)");
  BOOST_TEST(error_of(with_idempotency("      tll: 48h\n")) ==
             "t.yaml:12: routes[0].idempotency.tll: unknown key (expected one of: mode, methods, "
             "ttl, lock_ttl, key_scope, fingerprint, upstream_key, upstream_key_secret_file, "
             "key_source, key_headers, key_format, on_mismatch, concurrency, wait_timeout, "
             "max_waiters, store_statuses, "
             "max_stored_response, on_unknown_outcome, fingerprint_body, on_store_error, "
             "commit_timeout, replay_cache_ttl, replay_cache_max_bytes)");
  BOOST_TEST(error_of(replace(kBase, "path_prefix: /", "path_prefix: /, hosts: a.com")) ==
             "t.yaml:8: routes[0].match.hosts: unknown key (expected one of: path_prefix, path, "
             "host, methods)");
  BOOST_TEST(error_of(with_idempotency("      key_scope: { header: [A] }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_scope.header: unknown key (expected one of: "
             "headers)");
  BOOST_TEST(error_of(replace(kBase, "port: 0 }", "port: 0, tls: { cert: a, key: b, ca: c } }")) ==
             "t.yaml:1: listen.tls.ca: unknown key (expected one of: cert, key, alpn)");
}

BOOST_AUTO_TEST_CASE(duplicate_keys_are_rejected) {
  BOOST_TEST(error_of(with_idempotency("      ttl: 24h\n      ttl: 48h\n")) ==
             "t.yaml:13: routes[0].idempotency.ttl: duplicate key (first at line 12)");
}

BOOST_AUTO_TEST_CASE(required_keys_are_named_when_missing) {
  BOOST_TEST(error_of(replace(kBase, "listen: { address: 127.0.0.1, port: 0 }\n", "")) ==
             "t.yaml:1: listen: required key is missing");
  BOOST_TEST(
      error_of(replace(kBase, "{ address: 127.0.0.1, port: 0 }", "{ address: 127.0.0.1 }")) ==
      "t.yaml:1: listen.port: required key is missing");
  BOOST_TEST(error_of(replace(kBase, "dsn:", "dns:")) ==
             "t.yaml:3: storage.postgres.dns: unknown key (expected one of: dsn, pool_size, "
             "operation_timeout, prepared_statements, max_pending)");
  BOOST_TEST(error_of(replace(kBase, "{ dsn: \"postgresql://idem@127.0.0.1:5432/idem\" }",
                              "{ pool_size: 4 }")) ==
             "t.yaml:3: storage.postgres.dsn: required key is missing");
  BOOST_TEST(error_of(replace(kBase, "{ dsn: \"postgresql://idem@127.0.0.1:5432/idem\" }",
                              "{ dsn: \"\" }")) ==
             "t.yaml:3: storage.postgres.dsn: must not be empty");
  BOOST_TEST(error_of(replace(kBase, "    upstream: app\n", "")) ==
             "t.yaml:7: routes[0].upstream: required key is missing");
  BOOST_TEST(error_of(replace(kBase, "    match: { path_prefix: / }\n", "")) ==
             "t.yaml:7: routes[0].match: required key is missing");
  BOOST_TEST(error_of(replace(kBase, "{ servers: [\"127.0.0.1:9001\"] }", "{ servers: [] }")) ==
             "t.yaml:5: upstreams.app.servers: at least one \"host:port\" is required");
}

BOOST_AUTO_TEST_CASE(spec_C10_C11_mode_off_unquoted_is_the_word_not_a_boolean) {
  BOOST_TEST(
      (idem_of(replace(kBase, "mode: required", "mode: off")).mode == cfg::IdempotencyMode::off));
  BOOST_TEST((idem_of(replace(kBase, "mode: required", "mode: \"off\"")).mode ==
              cfg::IdempotencyMode::off));
  BOOST_TEST((idem_of(replace(kBase, "mode: required", "mode: optional")).mode ==
              cfg::IdempotencyMode::optional));
  BOOST_TEST(error_of(replace(kBase, "mode: required", "mode: no")) ==
             "t.yaml:11: routes[0].idempotency.mode: expected one of off | optional | required, "
             "got \"no\"");
  BOOST_TEST(error_of(replace(kBase, "mode: required", "mode:")) ==
             "t.yaml:11: routes[0].idempotency.mode: expected a single value, got an empty value");
}

BOOST_AUTO_TEST_CASE(durations_need_a_unit_among_ms_s_m_h) {
  BOOST_TEST(idem_of(with_idempotency("      lock_ttl: 1500ms\n")).lock_ttl.count() == 1500);
  BOOST_TEST(idem_of(with_idempotency("      lock_ttl: 2m\n")).lock_ttl.count() == 120'000);
  BOOST_TEST(error_of(with_idempotency("      ttl: 48\n")) ==
             "t.yaml:12: routes[0].idempotency.ttl: a bare number is not a duration: write the "
             "unit, e.g. \"48s\" (units: ms, s, m, h)");
  BOOST_TEST(error_of(with_idempotency("      ttl: 2d\n")) ==
             "t.yaml:12: routes[0].idempotency.ttl: unknown unit \"d\" in \"2d\" (units: ms, s, "
             "m, h)");
  BOOST_TEST(error_of(with_idempotency("      ttl: 1.5h\n")) ==
             "t.yaml:12: routes[0].idempotency.ttl: fractions are not supported: use a smaller "
             "unit, e.g. \"1500ms\"");
  BOOST_TEST(error_of(with_idempotency("      ttl: -1s\n")) ==
             "t.yaml:12: routes[0].idempotency.ttl: expected a duration like \"250ms\", \"30s\", "
             "\"10m\" or \"48h\", got \"-1s\"");
  BOOST_TEST(
      error_of(with_idempotency("      ttl: 99999999999999h\n")) ==
      "t.yaml:12: routes[0].idempotency.ttl: must be between 1s and 8760h, got 99999999999999h");
}

BOOST_AUTO_TEST_CASE(sizes_take_bytes_or_binary_units) {
  BOOST_TEST(idem_of(with_idempotency("      max_stored_response: 512KiB\n")).max_stored_response ==
             512u * 1024u);
  BOOST_TEST(idem_of(with_idempotency("      max_stored_response: 1000\n")).max_stored_response ==
             1000u);
  BOOST_TEST(idem_of(with_idempotency("      max_stored_response: 0B\n")).max_stored_response ==
             0u);
  BOOST_TEST(error_of(with_idempotency("      max_stored_response: 8MB\n")) ==
             "t.yaml:12: routes[0].idempotency.max_stored_response: unknown unit \"MB\" in "
             "\"8MB\" (units: B, KiB, MiB, GiB; powers of 1024)");
  BOOST_TEST(error_of(with_idempotency("      max_stored_response: 1GiB\n")) ==
             "t.yaml:12: routes[0].idempotency.max_stored_response: must be between 0B and "
             "256MiB, got 1GiB");
  BOOST_TEST(error_of(with_idempotency("      max_stored_response: 999999999999GiB\n")) ==
             "t.yaml:12: routes[0].idempotency.max_stored_response: must be between 0B and "
             "256MiB, got 999999999999GiB");
}

BOOST_AUTO_TEST_CASE(spec_C04_C07_limits_are_read_with_max_header_bytes) {
  const auto c = load(kBase +
                      "limits: { max_request_body: 64KiB, max_header_bytes: 16KiB, "
                      "header_read_timeout: 250ms, idle_timeout: 5s, drain_timeout: 0s }\n");
  BOOST_TEST(c->limits.max_request_body == 64u * 1024u);
  BOOST_TEST(c->limits.max_header_bytes == 16u * 1024u);
  BOOST_TEST(c->limits.header_read_timeout.count() == 250);
  BOOST_TEST(c->limits.idle_timeout.count() == 5000);
  BOOST_TEST(c->limits.drain_timeout.count() == 0);
  BOOST_TEST(error_of(kBase + "limits: { max_header_bytes: 100 }\n") ==
             "t.yaml:12: limits.max_header_bytes: must be between 1KiB and 1MiB, got 100");
}

BOOST_AUTO_TEST_CASE(spec_C38_C40_streaming_limits_have_defaults_and_ranges) {
  const auto d = load(kBase);
  BOOST_TEST(d->limits.stream_buffer == 64u * 1024u);
  BOOST_TEST(d->limits.max_streamed_body == 0u);  // no limit
  BOOST_TEST(
      std::chrono::duration_cast<std::chrono::seconds>(d->limits.tunnel_idle_timeout).count() ==
      300);
  const auto c = load(kBase +
                      "limits: { stream_buffer: 16KiB, max_streamed_body: 10GiB, "
                      "tunnel_idle_timeout: 2s }\n");
  BOOST_TEST(c->limits.stream_buffer == 16u * 1024u);
  BOOST_TEST(c->limits.max_streamed_body == 10ull * 1024u * 1024u * 1024u);
  BOOST_TEST(c->limits.tunnel_idle_timeout.count() == 2000);
  BOOST_TEST(error_of(kBase + "limits: { stream_buffer: 100 }\n") ==
             "t.yaml:12: limits.stream_buffer: must be between 1KiB and 16MiB, got 100");
  BOOST_TEST(error_of(kBase + "limits: { max_streamed_body: 0B }\n") ==
             "t.yaml:12: limits.max_streamed_body: must be between 1B and 1024GiB, got 0B");
}

BOOST_AUTO_TEST_CASE(spec_C49_C50_http2_keys_have_defaults_and_ranges) {
  InSourceDir here;  // the TLS files below are named from the source directory
  const auto d = load(kBase);
  BOOST_TEST(d->listen.h2c);
  BOOST_TEST(d->limits.h2_max_concurrent_streams == 100u);
  std::string off = kBase;
  off.replace(off.find("port: 0 }"), 9, "port: 0, h2c: false }");
  const auto c = load(off + "limits: { h2_max_concurrent_streams: 8 }\n");
  BOOST_TEST(!c->listen.h2c);
  BOOST_TEST(c->limits.h2_max_concurrent_streams == 8u);
  BOOST_TEST(error_of(kBase + "limits: { h2_max_concurrent_streams: 0 }\n") ==
             "t.yaml:12: limits.h2_max_concurrent_streams: must be between 1 and 10000, got 0");
  BOOST_TEST(error_of(kBase + "admin: { port: 0, h2c: true }\n").find("admin.h2c") !=
             std::string::npos);
  // ALPN on a TLS listener: h2 then http/1.1 unless the list says otherwise.
  BOOST_TEST((d->listen.tls_alpn == std::vector<std::string>{"h2", "http/1.1"}));
  const auto tls = [&](const std::string& alpn) {
    return replace(kBase, "port: 0 }",
                   "port: 0, tls: { cert: tests/data/config/tls/test.crt, key: "
                   "tests/data/config/tls/test.key" +
                       alpn + " } }");
  };
  BOOST_TEST(
      (load(tls(", alpn: [http/1.1]"))->listen.tls_alpn == std::vector<std::string>{"http/1.1"}));
  BOOST_TEST(error_of(tls(", alpn: []")) == "t.yaml:1: listen.tls.alpn: must not be empty");
  BOOST_TEST(error_of(tls(", alpn: [h2, h2]")) ==
             "t.yaml:1: listen.tls.alpn[1]: duplicate protocol \"h2\"");
  BOOST_TEST(error_of(tls(", alpn: [h3]")).find("listen.tls.alpn[0]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(request_id_defaults_to_a_generated_x_request_id) {
  const auto d = load(kBase);
  BOOST_TEST(d->request_id.header == "X-Request-Id");
  BOOST_TEST(d->request_id.generate);
  const auto c = load(kBase + "request_id: { header: X-Correlation-ID, generate: false }\n");
  BOOST_TEST(c->request_id.header == "X-Correlation-ID");
  BOOST_TEST(!c->request_id.generate);
  BOOST_TEST(load(kBase + "request_id: {}\n")->request_id.header == "X-Request-Id");
}

BOOST_AUTO_TEST_CASE(request_id_header_is_a_field_name_the_gateway_does_not_use_otherwise) {
  BOOST_TEST(error_of(kBase + "request_id: { header: \"Request Id\" }\n") ==
             "t.yaml:12: request_id.header: \"Request Id\" is not a valid header name");
  BOOST_TEST(error_of(kBase + "request_id: { header: \"\" }\n") ==
             "t.yaml:12: request_id.header: must not be empty");
  for (const char* used :
       {"Connection", "host", "Content-Length", "X-Forwarded-For", "Via", "Authorization",
        "Idempotency-Key", "Idempotent-Replayed", "traceparent"}) {
    BOOST_TEST(error_of(kBase + "request_id: { header: " + used + " }\n") ==
               "t.yaml:12: request_id.header: \"" + std::string(used) +
                   "\" is a field the gateway or the idempotency contract already uses; choose "
                   "another name, e.g. X-Request-Id");
  }
  BOOST_TEST(error_of(kBase + "request_id: { generate: yes }\n") ==
             "t.yaml:12: request_id.generate: expected one of true | false, got \"yes\"");
  BOOST_TEST(error_of(kBase + "request_id: { generated: true }\n") ==
             "t.yaml:12: request_id.generated: unknown key (expected one of: header, generate)");
  BOOST_TEST(error_of(kBase + "request_id: X-Request-Id\n") ==
             "t.yaml:12: request_id: expected a mapping, got \"X-Request-Id\"");
}

BOOST_AUTO_TEST_CASE(request_id_that_the_gateway_generates_cannot_be_a_key) {
  // Reported on the key_source line, wherever request_id stands in the file.
  BOOST_TEST(error_of(with_idempotency("      key_source: { header: x-request-id }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source: the key cannot come from "
             "X-Request-Id, where the gateway generates request ids; set request_id.generate: "
             "false or take the key from another field");
  BOOST_TEST(error_of(with_idempotency("      key_source: { headers: [X-Tenant, X-Request-Id] }\n"
                                       "request_id: { generate: true }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source: the key cannot come from "
             "X-Request-Id, where the gateway generates request ids; set request_id.generate: "
             "false or take the key from another field");
  // Without generation the client's id may be the key.
  const auto c =
      load(with_idempotency("      key_source: { header: X-Request-Id }\n"
                            "request_id: { generate: false }\n"));
  BOOST_TEST(cfg::contract_of(c->routes.at(0)).idempotency.key_source.header == "X-Request-Id");
  // In the scope or the fingerprint it only warns: a client that repeats its id still works.
  const auto w =
      load(with_idempotency("      key_scope: { headers: [X-Request-Id] }\n"
                            "      fingerprint: { headers: [x-request-id] }\n"));
  BOOST_TEST(has_warning(*w,
                         "t.yaml:12: routes[0].idempotency.key_scope: X-Request-Id differs from "
                         "request to request when the gateway generates it (request_id): "
                         "retries of one operation would not be recognised"));
  BOOST_TEST(has_warning(*w,
                         "t.yaml:13: routes[0].idempotency.fingerprint: x-request-id differs "
                         "from request to request when the gateway generates it (request_id): "
                         "retries of one operation would not be recognised"));
  BOOST_TEST(load(with_idempotency("      key_scope: { headers: [X-Request-Id] }\n"
                                   "request_id: { generate: false }\n"))
                 ->warnings.empty());
}

BOOST_AUTO_TEST_CASE(spec_C40_route_upgrade_takes_websocket_only) {
  BOOST_TEST(load(kBase)->routes.at(0).upgrade.empty());
  const auto c =
      load(replace(kBase, "    upstream: app\n", "    upstream: app\n    upgrade: [WebSocket]\n"));
  BOOST_TEST(c->routes.at(0).upgrade == std::vector<std::string>{"websocket"});
  BOOST_TEST(
      error_of(replace(kBase, "    upstream: app\n", "    upstream: app\n    upgrade: [h2c]\n")) ==
      "t.yaml:10: routes[0].upgrade: the only protocol that can be upgraded to is "
      "websocket, got \"h2c\"");
}

BOOST_AUTO_TEST_CASE(ports_are_1_to_65535_and_listeners_may_take_0) {
  BOOST_TEST(error_of(replace(kBase, "port: 0 }", "port: 65536 }")) ==
             "t.yaml:1: listen.port: must be between 0 and 65535, got 65536");
  BOOST_TEST(error_of(replace(kBase, "port: 0 }", "port: http }")) ==
             "t.yaml:1: listen.port: expected an integer, got \"http\"");
  BOOST_TEST(error_of(kBase + "admin: { port: 0 }\nstorage2: 1\n") ==
             "t.yaml:13: storage2: unknown key (expected one of: listen, admin, threads, limits, "
             "request_id, storage, upstreams, routes)");
  BOOST_TEST(load(kBase + "admin: { port: 0 }\n")->admin.port == 0);
  BOOST_TEST(error_of(replace(kBase, "upstreams:\n", "  redis: { port: 0 }\nupstreams:\n")) ==
             "t.yaml:4: storage.redis.port: must be between 1 and 65535, got 0");
  BOOST_TEST(error_of(replace(kBase, "port: 0 }", "port: 9090 }")) ==
             "t.yaml:1: listen.port: listen and admin use the same port 9090");
}

BOOST_AUTO_TEST_CASE(listen_address_must_be_an_ip_literal) {
  BOOST_TEST(load(replace(kBase, "127.0.0.1, port: 0", "\"::\", port: 0"))->listen.address == "::");
  BOOST_TEST(error_of(replace(kBase, "127.0.0.1, port: 0", "localhost, port: 0")) ==
             "t.yaml:1: listen.address: expected an IP address such as 127.0.0.1, 0.0.0.0 or ::1, "
             "got \"localhost\"");
}

BOOST_AUTO_TEST_CASE(upstream_servers_are_host_port_with_bracketed_ipv6) {
  const auto c = load(replace(kBase, "[\"127.0.0.1:9001\"]",
                              "[\"[::1]:9001\", \"api.internal:80\", \"10.0.0.2:65535\"]"));
  const auto& s = c->upstreams.at("app").servers;
  BOOST_TEST_REQUIRE(s.size() == 3u);
  BOOST_TEST(s[0].host == "::1");
  BOOST_TEST(s[0].port == 9001);
  BOOST_TEST(s[1].host == "api.internal");
  BOOST_TEST(s[2].port == 65535);
  BOOST_TEST(error_of(replace(kBase, "127.0.0.1:9001", "::1:9001")) ==
             "t.yaml:5: upstreams.app.servers[0]: an IPv6 address goes in brackets, e.g. "
             "\"[::1]:9001\", got \"::1:9001\"");
  BOOST_TEST(error_of(replace(kBase, "127.0.0.1:9001", "127.0.0.1")) ==
             "t.yaml:5: upstreams.app.servers[0]: expected \"host:port\" (IPv6 as \"[::1]:9001\"), "
             "got \"127.0.0.1\"");
  BOOST_TEST(error_of(replace(kBase, "127.0.0.1:9001", "127.0.0.1:0")) ==
             "t.yaml:5: upstreams.app.servers[0]: the port must be 1-65535, got \"127.0.0.1:0\"");
  BOOST_TEST(error_of(replace(kBase, "127.0.0.1:9001", "[fe80::zz]:80")) ==
             "t.yaml:5: upstreams.app.servers[0]: \"fe80::zz\" is not an IPv6 address");
}

BOOST_AUTO_TEST_CASE(routes_name_an_existing_upstream_and_have_unique_names) {
  BOOST_TEST(error_of(replace(kBase, "upstream: app", "upstream: ap")) ==
             "t.yaml:9: routes[0].upstream: no upstream named \"ap\" (defined: app)");
  BOOST_TEST(error_of(kBase + "  - name: r\n    match: { path: /x }\n    upstream: app\n") ==
             "t.yaml:12: routes[1].name: duplicate route name \"r\" (first at line 7)");
  BOOST_TEST(error_of(replace(kBase, "name: r", "name: \"\"")) ==
             "t.yaml:7: routes[0].name: must not be empty");
  BOOST_TEST(error_of(replace(kBase, "name: r", "name: a b")) ==
             "t.yaml:7: routes[0].name: a route name is 1-64 letters, digits, '.', '_' or '-'");
  BOOST_TEST(error_of(kBase.substr(0, kBase.find("routes:")) + "routes: []\n") ==
             "t.yaml:6: routes: at least one route is required");
}

BOOST_AUTO_TEST_CASE(match_needs_exactly_one_of_path_and_path_prefix) {
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path_prefix: /, path: /a }")) ==
             "t.yaml:8: routes[0].match.path: set either path or path_prefix, not both");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ host: a.com }")) ==
             "t.yaml:8: routes[0].match: needs path_prefix or path (use path_prefix: / to match "
             "all)");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path_prefix: api }")) ==
             "t.yaml:8: routes[0].match.path_prefix: must start with \"/\", got \"api\"");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path_prefix: /a//%70ay/./ }")) ==
             "t.yaml:8: routes[0].match.path_prefix: must be in normal form (no \"//\", \".\" or "
             "\"..\" segments, no escaped letters, digits or -._~), write \"/a/pay/\" for "
             "\"/a//%70ay/./\"");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path: /x/../health }")) ==
             "t.yaml:8: routes[0].match.path: must be in normal form (no \"//\", \".\" or "
             "\"..\" segments, no escaped letters, digits or -._~), write \"/health\" for "
             "\"/x/../health\"");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path: /, host: \"a.com:80\" }")) ==
             "t.yaml:8: routes[0].match.host: expected a host name without port, optionally "
             "\"*.\" first, got \"a.com:80\"");
  BOOST_TEST(error_of(replace(kBase, "{ path_prefix: / }", "{ path: /, methods: [GET, GET] }")) ==
             "t.yaml:8: routes[0].match.methods[1]: duplicate method \"GET\"");
}

BOOST_AUTO_TEST_CASE(enumerations_accept_only_their_words) {
  BOOST_TEST(error_of(with_idempotency("      concurrency: queue\n")) ==
             "t.yaml:12: routes[0].idempotency.concurrency: expected one of reject | wait, got "
             "\"queue\"");
  BOOST_TEST(error_of(with_idempotency("      upstream_key: hash\n")) ==
             "t.yaml:12: routes[0].idempotency.upstream_key: expected one of passthrough | "
             "rewrite | strip, got \"hash\"");
  BOOST_TEST(error_of(with_idempotency("      on_unknown_outcome: keep\n")) ==
             "t.yaml:12: routes[0].idempotency.on_unknown_outcome: expected one of hold | "
             "release, got \"keep\"");
  BOOST_TEST(error_of(with_idempotency("      fingerprint_body: text\n")) ==
             "t.yaml:12: routes[0].idempotency.fingerprint_body: expected one of bytes | json, "
             "got \"text\"");
  BOOST_TEST(error_of(with_idempotency("      on_store_error: fail-open\n")) ==
             "t.yaml:12: routes[0].idempotency.on_store_error: expected one of fail_closed | "
             "fail_open, got \"fail-open\"");
  const auto& i = idem_of(with_idempotency(
      "      concurrency: wait\n      upstream_key: strip\n      on_unknown_outcome: release\n"
      "      fingerprint_body: json\n      on_store_error: fail_open\n"));
  BOOST_TEST((i.concurrency == cfg::Concurrency::wait));
  BOOST_TEST((i.upstream_key == cfg::UpstreamKey::strip));
  BOOST_TEST((i.on_unknown_outcome == cfg::UnknownOutcome::release));
  BOOST_TEST((i.fingerprint_body == cfg::FingerprintBody::json));
  BOOST_TEST((i.on_store_error == cfg::StoreErrorPolicy::fail_open));
}

BOOST_AUTO_TEST_CASE(spec_C17_on_mismatch_is_422_409_or_400) {
  BOOST_TEST(idem_of(with_idempotency("      on_mismatch: 409\n")).on_mismatch == 409);
  BOOST_TEST(idem_of(with_idempotency("      on_mismatch: 400\n")).on_mismatch == 400);
  BOOST_TEST(error_of(with_idempotency("      on_mismatch: 418\n")) ==
             "t.yaml:12: routes[0].idempotency.on_mismatch: expected one of 422 | 409 | 400, got "
             "\"418\"");
}

BOOST_AUTO_TEST_CASE(spec_C14_rewrite_requires_a_readable_non_empty_secret_file) {
  BOOST_TEST(error_of(with_idempotency("      upstream_key: rewrite\n")) ==
             "t.yaml:12: routes[0].idempotency.upstream_key_secret_file: required when "
             "upstream_key is rewrite");
  BOOST_TEST(error_of(with_idempotency("      upstream_key: rewrite\n"
                                       "      upstream_key_secret_file: missing.key\n")) ==
             "t.yaml:13: routes[0].idempotency.upstream_key_secret_file: cannot read "
             "\"missing.key\": No such file or directory");
  // Strip and passthrough do not need the file, so it is not read.
  BOOST_TEST(idem_of(with_idempotency("      upstream_key: strip\n"
                                      "      upstream_key_secret_file: missing.key\n"))
                 .upstream_key_secret.empty());
}

BOOST_AUTO_TEST_CASE(short_hmac_secret_and_non_default_key_source_rewrite_warn) {
  InSourceDir here;
  const std::string name = "tests/data/config/inline.yaml";
  const auto c = cfg::load_config_from_string(
      with_idempotency("      upstream_key: rewrite\n      upstream_key_secret_file: short.key\n"
                       "      key_source: { header: ce-id }\n"),
      name);
  BOOST_TEST(cfg::contract_of(c->routes[0]).idempotency.upstream_key_secret == "tooshort");
  BOOST_TEST(has_warning(*c, name +
                                 ":13: routes[0].idempotency.upstream_key_secret_file: the secret "
                                 "has 8 bytes; HMAC-SHA-256 wants at least 32 (RFC 2104 §3)"));
  BOOST_TEST(has_warning(*c, name + ":12: routes[0].idempotency.upstream_key: has no effect: "
                                    "upstream_key applies to the Idempotency-Key source only (SPEC "
                                    "C37)"));
}

BOOST_AUTO_TEST_CASE(idempotency_methods_outside_match_methods_warn) {
  const auto c = load(replace(kBase, "{ path_prefix: / }", "{ path_prefix: /, methods: [GET] }"));
  BOOST_TEST(has_warning(*c,
                         "t.yaml:10: routes[0].idempotency: none of the idempotency methods "
                         "is in match.methods: the contract never applies"));
  const auto d = load(replace(kBase, "{ path_prefix: / }", "{ path_prefix: /, methods: [PUT] }") +
                      "      methods: [PUT]\n");
  BOOST_TEST(d->warnings.empty());
}

BOOST_AUTO_TEST_CASE(ttl_is_at_least_1s_and_outside_24h_to_72h_warns) {
  BOOST_TEST(error_of(with_idempotency("      ttl: 999ms\n")) ==
             "t.yaml:12: routes[0].idempotency.ttl: must be between 1s and 8760h, got 999ms");
  const auto c = load(with_idempotency("      ttl: 12h\n"));
  BOOST_TEST(cfg::contract_of(c->routes[0]).idempotency.ttl.count() == 12 * 3'600'000);
  BOOST_TEST_REQUIRE(c->warnings.size() == 1u);
  BOOST_TEST(c->warnings[0] ==
             "t.yaml:12: routes[0].idempotency.ttl: ttl 12h is outside 24h-72h: shorter lets late "
             "retries execute again, longer keeps records past any client's retry window (seed "
             "R-DIST-IDEM-5)");
  BOOST_TEST(load(with_idempotency("      ttl: 72h\n"))->warnings.empty());
  BOOST_TEST(load(with_idempotency("      ttl: 24h\n"))->warnings.empty());
}

BOOST_AUTO_TEST_CASE(spec_C23_lock_ttl_is_1s_to_10m) {
  BOOST_TEST(error_of(with_idempotency("      lock_ttl: 11m\n")) ==
             "t.yaml:12: routes[0].idempotency.lock_ttl: must be between 1s and 10m, got 11m");
  BOOST_TEST(error_of(with_idempotency("      lock_ttl: 500ms\n")) ==
             "t.yaml:12: routes[0].idempotency.lock_ttl: must be between 1s and 10m, got 500ms");
  const auto c = load(with_idempotency("      lock_ttl: 1s\n"));
  BOOST_TEST(has_warning(*c,
                         "t.yaml:12: routes[0].idempotency.lock_ttl: lock_ttl 1s is under 3 x "
                         "storage.redis.operation_timeout: one slow renewal can let the lock "
                         "expire"));
}

BOOST_AUTO_TEST_CASE(spec_C18_wait_timeout_is_at_most_twice_lock_ttl_when_waiting) {
  BOOST_TEST(idem_of(with_idempotency("      concurrency: wait\n      wait_timeout: 60s\n"))
                 .wait_timeout.count() == 60'000);
  BOOST_TEST(error_of(with_idempotency("      concurrency: wait\n      wait_timeout: 61s\n")) ==
             "t.yaml:13: routes[0].idempotency.wait_timeout: must not exceed 2 x lock_ttl (1m), "
             "got 61s");
  BOOST_TEST(error_of(with_idempotency("      lock_ttl: 2s\n      concurrency: wait\n")) ==
             "t.yaml:13: routes[0].idempotency.wait_timeout: wait_timeout 10s exceeds 2 x lock_ttl "
             "(4s); set wait_timeout");
  // With reject the waiting bound is unused, so a short lock_ttl needs no wait_timeout.
  BOOST_TEST(idem_of(with_idempotency("      lock_ttl: 2s\n")).wait_timeout.count() == 10'000);
}

BOOST_AUTO_TEST_CASE(spec_C26_commit_timeout_defaults_to_10s_and_is_0s_to_10m) {
  BOOST_TEST(idem_of(with_idempotency("      commit_timeout: 0s\n")).commit_timeout.count() == 0);
  BOOST_TEST(idem_of(with_idempotency("      commit_timeout: 10m\n")).commit_timeout.count() ==
             600'000);
  BOOST_TEST(error_of(with_idempotency("      commit_timeout: 11m\n")) ==
             "t.yaml:12: routes[0].idempotency.commit_timeout: must be between 0s and 10m, got "
             "11m");
}

BOOST_AUTO_TEST_CASE(spec_C23_replay_cache_keys_default_to_5m_and_16KiB_and_never_exceed_ttl) {
  const auto defaults = idem_of(with_idempotency(""));
  BOOST_TEST(defaults.replay_cache_ttl.count() == 300'000);
  BOOST_TEST(defaults.replay_cache_max_bytes == 16u * 1024u);
  // The default marker lifetime is cut to a shorter record ttl.
  BOOST_TEST(idem_of(with_idempotency("      ttl: 2m\n")).replay_cache_ttl.count() == 120'000);
  BOOST_TEST(idem_of(with_idempotency("      replay_cache_ttl: 0s\n")).replay_cache_ttl.count() ==
             0);
  BOOST_TEST(
      idem_of(with_idempotency("      replay_cache_max_bytes: 1MiB\n")).replay_cache_max_bytes ==
      1024u * 1024u);
  BOOST_TEST(error_of(with_idempotency("      ttl: 1h\n      replay_cache_ttl: 2h\n")) ==
             "t.yaml:13: routes[0].idempotency.replay_cache_ttl: must not exceed ttl (1h), got 2h");
  BOOST_TEST(
      error_of(with_idempotency("      replay_cache_max_bytes: 2MiB\n"))
          .find("t.yaml:12: routes[0].idempotency.replay_cache_max_bytes: must be between") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C18_max_waiters_defaults_to_32_and_is_0_to_10000) {
  BOOST_TEST(idem_of(with_idempotency("      concurrency: wait\n")).max_waiters == 32u);
  BOOST_TEST(idem_of(with_idempotency("      max_waiters: 0\n")).max_waiters == 0u);
  BOOST_TEST(idem_of(with_idempotency("      max_waiters: 10000\n")).max_waiters == 10'000u);
  BOOST_TEST(error_of(with_idempotency("      max_waiters: 10001\n")) ==
             "t.yaml:12: routes[0].idempotency.max_waiters: must be between 0 and 10000, got "
             "10001");
  BOOST_TEST(error_of(with_idempotency("      max_waiters: -1\n")) ==
             "t.yaml:12: routes[0].idempotency.max_waiters: must be between 0 and 10000, got -1");
  BOOST_TEST(error_of(with_idempotency("      max_waiters: many\n"))
                 .find("t.yaml:12: routes[0].idempotency.max_waiters: expected an integer") == 0u);
}

BOOST_AUTO_TEST_CASE(spec_C25_store_timeouts_are_10ms_to_60s_and_pool_1_to_256) {
  BOOST_TEST(error_of(replace(kBase, "idem\" }", "idem\", operation_timeout: 5ms }")) ==
             "t.yaml:3: storage.postgres.operation_timeout: must be between 10ms and 1m, got 5ms");
  BOOST_TEST(error_of(replace(kBase, "idem\" }", "idem\", pool_size: 0 }")) ==
             "t.yaml:3: storage.postgres.pool_size: must be between 1 and 256, got 0");
  BOOST_TEST(error_of(replace(kBase, "upstreams:\n",
                              "  redis: { operation_timeout: 61s }\nupstreams:\n")) ==
             "t.yaml:4: storage.redis.operation_timeout: must be between 10ms and 1m, got 61s");
  BOOST_TEST(error_of(replace(kBase, "listen:", "threads: 257\nlisten:")) ==
             "t.yaml:1: threads: must be between 0 and 256, got 257");
}

BOOST_AUTO_TEST_CASE(redis_and_cleanup_sections_are_read) {
  const auto c = load(
      "listen: { port: 0 }\n"
      "storage:\n"
      "  postgres: { dsn: x }\n"
      "  redis: { address: redis.local, port: 6380, db: 3, password: pw, operation_timeout: 250ms "
      "}\n"
      "  cleanup: { interval: 30s, batch: 100 }\n"
      "upstreams: { app: { servers: [\"a:1\"] } }\n"
      "routes: [ { name: r, match: { path: / }, upstream: app } ]\n");
  BOOST_TEST(c->storage.redis.address == "redis.local");
  BOOST_TEST(c->storage.redis.port == 6380);
  BOOST_TEST(c->storage.redis.db == 3);
  BOOST_TEST(c->storage.redis.password == "pw");
  BOOST_TEST(c->storage.redis.operation_timeout.count() == 250);
  BOOST_TEST(c->storage.cleanup.interval.count() == 30'000);
  BOOST_TEST(c->storage.cleanup.batch == 100);
}

BOOST_AUTO_TEST_CASE(a_redis_acl_username_is_read_and_needs_a_password) {
  const std::string text =
      "listen: { port: 0 }\n"
      "storage:\n"
      "  postgres: { dsn: x }\n"
      "  redis: { username: idemgate, password: pw }\n"
      "upstreams: { app: { servers: [\"a:1\"] } }\n"
      "routes: [ { name: r, match: { path: / }, upstream: app } ]\n";
  BOOST_TEST(load(text)->storage.redis.username == "idemgate");
  BOOST_TEST(error_of(replace(text, "username: idemgate, password: pw", "username: idemgate")) ==
             "t.yaml:4: storage.redis.username: an ACL username needs redis.password as well");
}

namespace {
std::string with_redis(const std::string& redis) {
  return "listen: { port: 0 }\n"
         "storage:\n"
         "  postgres: { dsn: x }\n"
         "  redis: " +
         redis +
         "\n"
         "upstreams: { app: { servers: [\"a:1\"] } }\n"
         "routes: [ { name: r, match: { path: / }, upstream: app } ]\n";
}
}  // namespace

BOOST_AUTO_TEST_CASE(spec_C41_sentinel_shape_reads_sentinels_master_name_and_wait_replicas) {
  const auto c = load(
      with_redis("{ sentinels: [\"10.0.0.1:26379\", \"[::1]:26380\"], master_name: pay, db: 2, "
                 "password: pw, sentinel_password: spw, wait_replicas: 1 }"));
  const auto& r = c->storage.redis;
  BOOST_TEST((r.mode == idemgate::config::Redis::Mode::sentinel));
  BOOST_REQUIRE_EQUAL(r.sentinels.size(), 2u);
  BOOST_TEST(r.sentinels[0].host == "10.0.0.1");
  BOOST_TEST(r.sentinels[0].port == 26379);
  BOOST_TEST(r.sentinels[1].host == "::1");
  BOOST_TEST(r.master_name == "pay");
  BOOST_TEST(r.db == 2);
  BOOST_TEST(r.sentinel_password == "spw");
  BOOST_TEST(r.wait_replicas == 1);
  BOOST_TEST(error_of(with_redis("{ sentinels: [\"h:1\"] }")) ==
             "t.yaml:4: storage.redis.master_name: required key is missing");
  BOOST_TEST(error_of(with_redis("{ sentinels: [] , master_name: m }")) ==
             "t.yaml:4: storage.redis.sentinels: at least one sentinel \"host:port\" is required");
  BOOST_TEST(error_of(with_redis("{ master_name: m }")) ==
             "t.yaml:4: storage.redis.master_name: redis.master_name needs redis.sentinels (the "
             "Sentinel shape)");
  BOOST_TEST(error_of(with_redis("{ wait_replicas: 17 }"))
                 .starts_with("t.yaml:4: storage.redis.wait_replicas:"));
}

BOOST_AUTO_TEST_CASE(spec_C42_cluster_shape_reads_seed_nodes_and_refuses_a_db) {
  const auto c = load(with_redis("{ cluster: [\"127.0.0.1:7000\", \"127.0.0.1:7001\"] }"));
  BOOST_TEST((c->storage.redis.mode == idemgate::config::Redis::Mode::cluster));
  BOOST_REQUIRE_EQUAL(c->storage.redis.cluster.size(), 2u);
  BOOST_TEST(c->storage.redis.cluster[1].port == 7001);
  BOOST_TEST(error_of(with_redis("{ cluster: [\"h:1\"], db: 3 }")) ==
             "t.yaml:4: storage.redis.db: a Redis Cluster has only db 0: remove redis.db or set "
             "it to 0");
  BOOST_TEST(error_of(with_redis("{ cluster: [\"h\"] }"))
                 .starts_with("t.yaml:4: storage.redis.cluster[0]: expected \"host:port\""));
}

BOOST_AUTO_TEST_CASE(spec_C44_prepared_statements_is_a_boolean_defaulting_to_true) {
  const std::string text =
      "listen: { port: 0 }\n"
      "storage:\n"
      "  postgres: { dsn: x, prepared_statements: false }\n"
      "upstreams: { app: { servers: [\"a:1\"] } }\n"
      "routes: [ { name: r, match: { path: / }, upstream: app } ]\n";
  BOOST_TEST(!load(text)->storage.postgres.prepared_statements);
  BOOST_TEST(load(replace(text, ", prepared_statements: false", ""))
                 ->storage.postgres.prepared_statements);
  BOOST_TEST(error_of(replace(text, "prepared_statements: false", "prepared_statements: maybe"))
                 .starts_with("t.yaml:3: storage.postgres.prepared_statements:"));
}

BOOST_AUTO_TEST_CASE(redis_shapes_that_mix_name_the_conflicting_keys) {
  BOOST_TEST(error_of(with_redis("{ cluster: [\"h:1\"], sentinels: [\"h:2\"], master_name: m }")) ==
             "t.yaml:4: storage.redis.cluster: redis.cluster and redis.sentinels are two "
             "different shapes of storage.redis: keep one of them");
  BOOST_TEST(error_of(with_redis("{ address: h, sentinels: [\"h:2\"], master_name: m }")) ==
             "t.yaml:4: storage.redis.address: redis.address names a single server and cannot be "
             "combined with redis.sentinels: keep one of them");
  BOOST_TEST(error_of(with_redis("{ port: 6380, cluster: [\"h:2\"] }")) ==
             "t.yaml:4: storage.redis.port: redis.port belongs to redis.address and cannot be "
             "combined with redis.cluster: keep one of them");
}

BOOST_AUTO_TEST_CASE(spec_C21_store_statuses_use_the_status_set_syntax) {
  const auto& i = idem_of(with_idempotency("      store_statuses: \"200-299, 404\"\n"));
  BOOST_TEST(i.store_statuses.contains(200));
  BOOST_TEST(i.store_statuses.contains(299));
  BOOST_TEST(i.store_statuses.contains(404));
  BOOST_TEST(!i.store_statuses.contains(300));
  BOOST_TEST(!i.store_statuses.contains(409));
  BOOST_TEST(error_of(with_idempotency("      store_statuses: 200-600\n")) ==
             "t.yaml:12: routes[0].idempotency.store_statuses: status code 600 is outside 100-599");
}

BOOST_AUTO_TEST_CASE(spec_C37_key_source_is_one_header_a_json_pointer_or_several_headers) {
  const auto& h = idem_of(with_idempotency("      key_source: { header: ce-id }\n"));
  BOOST_TEST((h.key_source.kind == cfg::KeySource::Kind::header));
  BOOST_TEST(h.key_source.header == "ce-id");
  const auto& j = idem_of(with_idempotency("      key_source: { json_pointer: /data/a~1b }\n"));
  BOOST_TEST((j.key_source.kind == cfg::KeySource::Kind::json_pointer));
  BOOST_TEST(j.key_source.json_pointer == "/data/a~1b");
  BOOST_TEST(j.key_source.header.empty());
  const auto& s =
      idem_of(with_idempotency("      key_source: { headers: [X-Saga-Id, X-Saga-Step] }\n"));
  BOOST_TEST((s.key_source.kind == cfg::KeySource::Kind::headers));
  BOOST_TEST((s.key_source.headers == std::vector<std::string>{"X-Saga-Id", "X-Saga-Step"}));

  BOOST_TEST(error_of(with_idempotency("      key_source: { json_pointer: event_id }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source.json_pointer: must start with \"/\" "
             "(RFC 6901), e.g. \"/event_id\"");
  BOOST_TEST(error_of(with_idempotency("      key_source: { json_pointer: /a~2 }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source.json_pointer: \"~\" must be followed by "
             "0 or 1 (RFC 6901 escapes ~0 and ~1)");
  BOOST_TEST(error_of(with_idempotency("      key_source: { headers: [X-Saga-Id] }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source.headers: needs at least two header "
             "names (one header: use key_source.header)");
  BOOST_TEST(error_of(with_idempotency("      key_source: { header: a, json_pointer: /b }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source.json_pointer: only one of header, "
             "json_pointer, headers may be set");
  BOOST_TEST(error_of(with_idempotency("      key_source: {}\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source: needs one of header, json_pointer, "
             "headers");
  BOOST_TEST(error_of(with_idempotency("      key_source: { header: \"Bad Name\" }\n")) ==
             "t.yaml:12: routes[0].idempotency.key_source.header: \"Bad Name\" is not a valid "
             "header name");
}

BOOST_AUTO_TEST_CASE(header_lists_hold_distinct_field_names) {
  const auto& i =
      idem_of(with_idempotency("      key_scope: { headers: [Authorization, X-Tenant] }\n      "
                               "fingerprint: { headers: [] }\n"));
  BOOST_TEST((i.key_scope_headers == std::vector<std::string>{"Authorization", "X-Tenant"}));
  BOOST_TEST(i.fingerprint_headers.empty());
  BOOST_TEST(error_of(with_idempotency("      fingerprint: { headers: [A, a] }\n")) ==
             "t.yaml:12: routes[0].idempotency.fingerprint.headers[1]: duplicate header name "
             "\"a\"");
  BOOST_TEST(error_of(with_idempotency("      methods: []\n")) ==
             "t.yaml:12: routes[0].idempotency.methods: must not be empty");
  BOOST_TEST(error_of(with_idempotency("      methods: POST\n")) ==
             "t.yaml:12: routes[0].idempotency.methods: expected a list, got \"POST\"");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(status_set)

using idemgate::core::StatusSet;

BOOST_AUTO_TEST_CASE(spec_C21_default_stores_2xx_to_4xx_except_transient_refusals) {
  const StatusSet d = StatusSet::default_storable();
  for (unsigned s : {200u, 201u, 204u, 301u, 304u, 400u, 402u, 404u, 409u, 410u, 422u, 499u}) {
    BOOST_TEST(d.contains(s), "status " << s);
  }
  for (unsigned s :
       {100u, 101u, 401u, 403u, 407u, 408u, 425u, 429u, 500u, 502u, 503u, 599u, 600u, 1000u}) {
    BOOST_TEST(!d.contains(s), "status " << s);
  }
}

BOOST_AUTO_TEST_CASE(default_equals_the_spec_list_text) {
  std::string error;
  const auto parsed = StatusSet::parse("200-400,402,404-406,409-424,426-428,430-499", error);
  BOOST_TEST_REQUIRE(parsed.has_value(), error);
  const StatusSet d = StatusSet::default_storable();
  for (unsigned s = 0; s < 700; ++s)
    BOOST_TEST(parsed->contains(s) == d.contains(s), "status " << s);
}

BOOST_AUTO_TEST_CASE(parse_accepts_codes_ranges_and_spaces) {
  std::string error;
  const auto set = StatusSet::parse(" 100 , 200 - 202,599", error);
  BOOST_TEST_REQUIRE(set.has_value(), error);
  BOOST_TEST(set->contains(100));
  BOOST_TEST(set->contains(201));
  BOOST_TEST(set->contains(599));
  BOOST_TEST(!set->contains(203));
  BOOST_TEST(!set->contains(101));
}

BOOST_AUTO_TEST_CASE(parse_rejects_malformed_lists_with_one_sentence) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "the list is empty; expected codes and ranges like \"200-299,404\""},
      {"99", "status code 99 is outside 100-599"},
      {"200-600", "status code 600 is outside 100-599"},
      {"300-200", "range 300-200 is reversed"},
      {"2xx", "'2xx' is not a status code (expected 100-599)"},
      {"200,", "expected a status code or a range like 200-299"},
      {"200--300", "'-300' is not a status code (expected 100-599)"},
      {"+200", "'+200' is not a status code (expected 100-599)"},
  };
  for (const auto& [text, expected] : cases) {
    std::string error;
    BOOST_TEST(!StatusSet::parse(text, error).has_value(), text);
    BOOST_TEST(error == expected, text);
  }
}

BOOST_AUTO_TEST_SUITE_END()
