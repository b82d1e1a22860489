// Known answers for every stored or keyed format (tests/data/vectors/README.md): fingerprints,
// canonical JSON, scopes, record ids, keys as read from their source, Redis key names and hash
// slots, the Postgres header blob, the committed marker, the upstream_key rewrite and HMAC-SHA-256
// (RFC 4231). A running deployment holds records and locks under these exact values: a change to
// any of them must fail here, never pass unnoticed. The files are only read; nothing rewrites them.
#define BOOST_TEST_MODULE known_answer
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/core/fingerprint.hpp"
#include "gateway/core/hash.hpp"
#include "gateway/core/idempotency_key.hpp"
#include "gateway/core/replay_marker.hpp"
#include "storage/pg/pg_record_codec.hpp"
#include "storage/redis/redis_cluster.hpp"
#include "storage/redis/redis_lock.hpp"

namespace core = idemgate::core;
namespace json = boost::json;
namespace pg = idemgate::storage::pg;
namespace redis = idemgate::storage::redis;

namespace {

/// Every vector file this test reads; a file added to the directory must be added here too.
const std::set<std::string> kVectorFiles = {
    "canonical_json.json", "fingerprint.json", "hmac_sha256_rfc4231.json", "key_source.json",
    "pg_headers.json",     "record_id.json",   "redis_slot.json",          "replay_marker.json",
    "scope.json",          "store_keys.json",  "upstream_key_rewrite.json"};

std::filesystem::path vector_dir() {
  const char* dir = std::getenv("IDEMGATE_SOURCE_DIR");
  BOOST_TEST_REQUIRE(dir != nullptr, "IDEMGATE_SOURCE_DIR is not set (ctest sets it)");
  return std::filesystem::path(dir) / "tests" / "data" / "vectors";
}

/// The `vectors` array of one file; never empty (an emptied file must not pass).
json::array load(const std::string& name) {
  BOOST_TEST_REQUIRE(kVectorFiles.contains(name));
  std::ifstream in(vector_dir() / name, std::ios::binary);
  BOOST_TEST_REQUIRE(in.good(), "cannot open " << (vector_dir() / name));
  std::stringstream text;
  text << in.rdbuf();
  json::array vectors = json::parse(text.str()).at("vectors").as_array();
  BOOST_TEST_REQUIRE(!vectors.empty(), name << " has no vectors");
  return vectors;
}

std::string str(const json::value& v) {
  return std::string(v.as_string());
}

std::string unhex(std::string_view hex) {
  BOOST_TEST_REQUIRE(hex.size() % 2 == 0, "odd hex length: " << hex);
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string hex(std::string_view bytes) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

/// A byte string of a vector: a JSON string is its UTF-8, {"hex": "…"} the bytes it spells.
std::string bytes_of(const json::value& v) {
  if (v.is_string()) return str(v);
  return unhex(v.at("hex").as_string());
}

core::Sha256 digest_of(const json::value& hex_text) {
  const std::string raw = unhex(hex_text.as_string());
  BOOST_TEST_REQUIRE(raw.size() == 32u);
  core::Sha256 out{};
  std::copy(raw.begin(), raw.end(), out.begin());
  return out;
}

/// `[{"name": …, "values": […]}, …]` as the views compute_scope and compute_fingerprint take.
class HeaderInput {
 public:
  explicit HeaderInput(const json::value& headers) {
    for (const auto& h : headers.as_array()) {
      core::HeaderValues header{keep(str(h.at("name"))), {}};
      for (const auto& v : h.at("values").as_array()) header.values.push_back(keep(bytes_of(v)));
      list_.push_back(std::move(header));
    }
  }
  const std::vector<core::HeaderValues>& list() const { return list_; }

 private:
  std::string_view keep(std::string s) { return storage_.emplace_back(std::move(s)); }
  std::deque<std::string> storage_;
  std::vector<core::HeaderValues> list_;
};

/// `[[name, value], …]` as stored header fields.
std::vector<core::HeaderField> fields_of(const json::value& fields) {
  std::vector<core::HeaderField> out;
  for (const auto& f : fields.as_array()) {
    out.emplace_back(bytes_of(f.as_array().at(0)), bytes_of(f.as_array().at(1)));
  }
  return out;
}

core::Sha256 scope_of(const json::object& v) {
  const HeaderInput headers(v.at("headers"));
  return core::compute_scope(str(v.at("route")), headers.list());
}

/// A canonical_json result as text for comparison and messages ("<not JSON>": nullopt, which
/// no JSON text can be mistaken for). `v`: the vector's string, or null for not JSON.
std::string shown(const std::optional<std::string>& canonical) {
  return canonical ? *canonical : "<not JSON>";
}
std::string shown(const json::value& v) {
  return v.is_null() ? "<not JSON>" : str(v);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_vector_file_is_read_by_this_test) {
  std::set<std::string> present;
  for (const auto& entry : std::filesystem::directory_iterator(vector_dir())) {
    if (entry.path().extension() == ".json") present.insert(entry.path().filename().string());
  }
  BOOST_TEST(present == kVectorFiles,
             "the .json files of tests/data/vectors and kVectorFiles differ");
}

BOOST_AUTO_TEST_CASE(spec_C17_C27_C35_fingerprints_match_known_answers) {
  for (const auto& entry : load("fingerprint.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("fingerprint.json: " << str(v.at("name"))) {
      const HeaderInput headers(v.at("headers"));
      const std::string body = bytes_of(v.at("body"));
      const std::string mode = str(v.at("mode"));
      BOOST_TEST_REQUIRE((mode == "bytes" || mode == "json"));
      if (mode == "json") {
        BOOST_TEST(shown(core::canonical_json(body)) == shown(v.at("canonical")));
      }
      const core::Sha256 fp =
          core::compute_fingerprint(str(v.at("method")), str(v.at("target")), headers.list(), body,
                                    mode == "json" ? core::BodyMode::json : core::BodyMode::bytes);
      BOOST_TEST(core::to_hex(fp) == str(v.at("fingerprint")));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C35_canonical_json_matches_known_answers) {
  for (const auto& entry : load("canonical_json.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("canonical_json.json: " << str(v.at("name"))) {
      const json::value& expected = v.at("canonical");
      BOOST_TEST(shown(core::canonical_json(bytes_of(v.at("input")))) == shown(expected));
      // A fixed point: the canonical text is its own canonical form.
      if (!expected.is_null()) {
        BOOST_TEST(shown(core::canonical_json(str(expected))) == str(expected));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C20_scopes_match_known_answers) {
  for (const auto& entry : load("scope.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("scope.json: " << str(v.at("name"))) {
      BOOST_TEST(core::to_hex(scope_of(v)) == str(v.at("scope")));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C23_record_ids_match_known_answers) {
  for (const auto& entry : load("record_id.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("record_id.json: " << str(v.at("name"))) {
      BOOST_TEST(core::to_hex(scope_of(v)) == str(v.at("scope")));
      const core::Sha256 id = core::record_id(digest_of(v.at("scope")), bytes_of(v.at("key")));
      BOOST_TEST(core::to_hex(id) == str(v.at("record_id")));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C13_C28_C37_keys_read_from_their_source_match_known_answers) {
  for (const auto& entry : load("key_source.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("key_source.json: " << str(v.at("name"))) {
      const std::string source = str(v.at("source"));
      core::KeyParse key;
      if (source == "header") {
        const HeaderInput field(
            json::array{json::object{{"name", "Idempotency-Key"}, {"values", v.at("values")}}});
        key = core::parse_key_field("Idempotency-Key", field.list().front().values);
      } else if (source == "headers") {
        json::array headers;
        std::vector<std::string> names;
        for (const auto& part : v.at("parts").as_array()) {
          names.push_back("X-Part-" + std::to_string(names.size()));
          headers.push_back(json::object{{"name", names.back()}, {"values", part}});
        }
        const HeaderInput fields(headers);
        std::vector<core::KeyParse> parts;
        for (const auto& h : fields.list())
          parts.push_back(core::parse_key_field(h.name, h.values));
        key = core::join_key_parts(names, parts);
      } else {
        BOOST_TEST_REQUIRE(source == "json_pointer");
        key = core::parse_json_pointer_key(bytes_of(v.at("body")), str(v.at("pointer")));
      }
      BOOST_TEST_REQUIRE((key.status == core::KeyParse::Status::valid), key.detail);
      BOOST_TEST(hex(key.key) == hex(bytes_of(v.at("key"))), "key " << key.key);
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C23_C42_redis_key_names_and_slots_match_known_answers) {
  for (const auto& entry : load("store_keys.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("store_keys.json: " << str(v.at("name"))) {
      if (const auto* from = v.if_contains("from")) {
        const auto& f = from->as_object();
        const core::Sha256 id = core::record_id(scope_of(f), bytes_of(f.at("key")));
        BOOST_TEST(core::to_hex(id) == str(v.at("record_id")));
      }
      // The committed marker replaces the lock's value under this same key (RedisLock::replace).
      const std::string key = redis::RedisLock::key_of(digest_of(v.at("record_id")));
      BOOST_TEST(key == str(v.at("redis_lock_key")));
      BOOST_TEST(redis::key_slot(key) == v.at("redis_slot").to_number<std::uint16_t>());
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C42_hash_slots_match_known_answers) {
  for (const auto& entry : load("redis_slot.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("redis_slot.json: " << str(v.at("name"))) {
      BOOST_TEST(redis::key_slot(bytes_of(v.at("key"))) == v.at("slot").to_number<std::uint16_t>());
    }
  }
}

BOOST_AUTO_TEST_CASE(postgres_header_blobs_match_known_answers_both_ways) {
  for (const auto& entry : load("pg_headers.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("pg_headers.json: " << str(v.at("name"))) {
      const auto fields = fields_of(v.at("headers"));
      BOOST_TEST(hex(pg::encode_headers(fields)) == str(v.at("blob")));
      // Rows already stored must keep decoding to the same fields.
      const auto decoded = pg::decode_headers(unhex(str(v.at("blob"))));
      BOOST_TEST_REQUIRE(decoded.has_value());
      BOOST_TEST((*decoded == fields));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C23_committed_markers_match_known_answers_both_ways) {
  for (const auto& entry : load("replay_marker.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("replay_marker.json: " << str(v.at("name"))) {
      core::ReplayMarker marker;
      marker.fingerprint = digest_of(v.at("fingerprint"));
      if (!v.at("response").is_null()) {
        const auto& r = v.at("response").as_object();
        core::StoredResponse response;
        response.status = r.at("status").to_number<std::uint16_t>();
        response.headers = fields_of(r.at("headers"));
        response.body = bytes_of(r.at("body"));
        response.body_omitted = r.at("body_omitted").as_bool();
        marker.response = std::move(response);
      }
      BOOST_TEST(hex(core::encode_replay_marker(marker)) == str(v.at("encoding")));
      // Markers already in Redis must keep decoding to the same record.
      const std::string stored = unhex(str(v.at("encoding")));
      BOOST_TEST(core::is_replay_marker(stored));
      const auto decoded = core::decode_replay_marker(stored);
      BOOST_TEST_REQUIRE(decoded.has_value());
      BOOST_TEST(core::to_hex(decoded->fingerprint) == core::to_hex(marker.fingerprint));
      BOOST_TEST_REQUIRE(decoded->response.has_value() == marker.response.has_value());
      if (marker.response) {
        BOOST_TEST(decoded->response->status == marker.response->status);
        BOOST_TEST((decoded->response->headers == marker.response->headers));
        BOOST_TEST(hex(decoded->response->body) == hex(marker.response->body));
        BOOST_TEST(decoded->response->body_omitted == marker.response->body_omitted);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C14_upstream_key_rewrite_matches_known_answers) {
  for (const auto& entry : load("upstream_key_rewrite.json")) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("upstream_key_rewrite.json: " << str(v.at("name"))) {
      const core::Sha256 scope = scope_of(v);
      BOOST_TEST(core::to_hex(scope) == str(v.at("scope")));
      BOOST_TEST(core::upstream_key_rewrite(bytes_of(v.at("secret")), scope,
                                            bytes_of(v.at("key"))) == str(v.at("value")));
    }
  }
}

BOOST_AUTO_TEST_CASE(spec_C14_hmac_sha256_matches_rfc4231) {
  const auto vectors = load("hmac_sha256_rfc4231.json");
  BOOST_TEST(vectors.size() == 7u, "RFC 4231 has test cases 1 to 7");
  for (const auto& entry : vectors) {
    const auto& v = entry.as_object();
    BOOST_TEST_CONTEXT("hmac_sha256_rfc4231.json: " << str(v.at("name"))) {
      std::string mac = core::hmac_sha256_hex(bytes_of(v.at("key")), bytes_of(v.at("data")));
      BOOST_TEST(mac.size() == 64u);
      if (const auto* bits = v.if_contains("truncated_to_bits")) {
        mac.resize(bits->to_number<std::size_t>() / 4);  // RFC 4231 test case 5: 128 bits
      }
      BOOST_TEST(mac == str(v.at("hmac_sha256")));
    }
  }
}
