// Route selection: file order, host patterns, exact and prefix paths, methods (SPEC §2, C01).
#define BOOST_TEST_MODULE router
#include <boost/test/unit_test.hpp>

#include "gateway/http/router.hpp"

using idemgate::http::match;
using idemgate::http::target_path;
namespace http = idemgate::http;

namespace {

http::Route route(std::string name, std::string path_prefix, std::string path = "",
                  std::string host = "", std::vector<std::string> methods = {}) {
  http::Match m;
  m.path_prefix = std::move(path_prefix);
  m.path = std::move(path);
  m.host = std::move(host);
  m.methods = std::move(methods);
  http::Route r;
  r.name = std::move(name);
  r.match = std::move(m);
  r.upstream = "u";
  return r;
}

std::string matched(const http::ProxyConfig& c, std::string_view host, std::string_view path,
                    std::string_view method) {
  const auto* r = match(c, host, path, method);
  return r ? r->name : "<none>";
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_C01_no_route_matches_returns_null) {
  http::ProxyConfig c;
  c.routes.push_back(route("payments", "/payments"));
  BOOST_TEST(match(c, "example.com", "/orders", "POST") == nullptr);
  BOOST_TEST(match(http::ProxyConfig{}, "example.com", "/", "GET") == nullptr);
}

BOOST_AUTO_TEST_CASE(routes_are_tried_in_file_order_first_match_wins) {
  http::ProxyConfig c;
  c.routes.push_back(route("narrow", "/payments", "", "", {"POST"}));
  c.routes.push_back(route("catch_all", "/"));
  BOOST_TEST(matched(c, "h", "/payments/1", "POST") == "narrow");
  BOOST_TEST(matched(c, "h", "/payments/1", "GET") == "catch_all");
  BOOST_TEST(&c.routes[0] == match(c, "h", "/payments", "POST"));
}

BOOST_AUTO_TEST_CASE(exact_path_must_equal_and_prefix_is_a_plain_prefix) {
  http::ProxyConfig c;
  c.routes.push_back(route("exact", "", "/health"));
  c.routes.push_back(route("prefix", "/pay"));
  BOOST_TEST(matched(c, "h", "/health", "GET") == "exact");
  BOOST_TEST(matched(c, "h", "/health/x", "GET") == "<none>");
  BOOST_TEST(matched(c, "h", "/healt", "GET") == "<none>");
  BOOST_TEST(matched(c, "h", "/payments", "GET") == "prefix");
  BOOST_TEST(matched(c, "h", "/pa", "GET") == "<none>");
}

BOOST_AUTO_TEST_CASE(host_ignores_port_and_case) {
  http::ProxyConfig c;
  c.routes.push_back(route("api", "/", "", "api.example.com"));
  BOOST_TEST(matched(c, "API.Example.COM:8443", "/x", "GET") == "api");
  BOOST_TEST(matched(c, "api.example.com", "/x", "GET") == "api");
  BOOST_TEST(matched(c, "api.example.com.", "/x", "GET") == "api");
  BOOST_TEST(matched(c, "other.example.com", "/x", "GET") == "<none>");
  BOOST_TEST(matched(c, "", "/x", "GET") == "<none>");
}

BOOST_AUTO_TEST_CASE(wildcard_host_matches_subdomains_only) {
  http::ProxyConfig c;
  c.routes.push_back(route("wild", "/", "", "*.example.com"));
  BOOST_TEST(matched(c, "a.example.com", "/", "GET") == "wild");
  BOOST_TEST(matched(c, "a.b.Example.com:80", "/", "GET") == "wild");
  BOOST_TEST(matched(c, "example.com", "/", "GET") == "<none>");
  BOOST_TEST(matched(c, "badexample.com", "/", "GET") == "<none>");
  BOOST_TEST(matched(c, ".example.com", "/", "GET") == "<none>");
}

BOOST_AUTO_TEST_CASE(route_without_host_matches_any_host_and_ipv6_literals_keep_brackets) {
  http::ProxyConfig c;
  c.routes.push_back(route("v6", "/", "", "[::1]"));
  c.routes.push_back(route("any", "/"));
  BOOST_TEST(matched(c, "[::1]:8080", "/", "GET") == "v6");
  BOOST_TEST(matched(c, "", "/", "GET") == "any");
}

BOOST_AUTO_TEST_CASE(methods_empty_means_any_and_compare_case_sensitively) {
  http::ProxyConfig c;
  c.routes.push_back(route("post", "/", "", "", {"POST", "PATCH"}));
  BOOST_TEST(matched(c, "h", "/", "PATCH") == "post");
  BOOST_TEST(matched(c, "h", "/", "post") == "<none>");
  BOOST_TEST(matched(c, "h", "/", "GET") == "<none>");
}

BOOST_AUTO_TEST_CASE(target_path_drops_query_and_reads_absolute_form) {
  BOOST_TEST(target_path("/a/b?x=1") == "/a/b");
  BOOST_TEST(target_path("/a#frag") == "/a");
  BOOST_TEST(target_path("http://h.example:80/p/q?z") == "/p/q");
  BOOST_TEST(target_path("http://h.example") == "/");
  BOOST_TEST(target_path("http://h.example?x=/y") == "/");
  BOOST_TEST(target_path("*") == "*");
}

namespace {
std::string normal(std::string_view path) {
  std::string scratch;
  return std::string(idemgate::http::normalized_path(path, scratch));
}
}  // namespace

BOOST_AUTO_TEST_CASE(normalized_path_decodes_unreserved_merges_slashes_and_removes_dot_segments) {
  BOOST_TEST(normal("/payments/1") == "/payments/1");
  BOOST_TEST(normal("/%70ayments") == "/payments");
  BOOST_TEST(normal("/%70%41%2d%2E%5f%7E") == "/pA-._~");
  BOOST_TEST(normal("/a%2fb%3F") == "/a%2Fb%3F");  // reserved: kept, hex upper-cased
  BOOST_TEST(normal("/a%zz%4") == "/a%25zz%254");  // a `%` that starts no escape is `%25`
  BOOST_TEST(normal("/%%32e%%32e/pay") == "/%252e%252e/pay");  // no escape appears later
  BOOST_TEST(normal("/%25%25") == "/%25%25");
  BOOST_TEST(normal("//payments") == "/payments");
  BOOST_TEST(normal("/a///b//") == "/a/b/");
  BOOST_TEST(normal("/./payments") == "/payments");
  BOOST_TEST(normal("/orders/../payments") == "/payments");
  BOOST_TEST(normal("/orders/%2e%2E/payments") == "/payments");
  BOOST_TEST(normal("/../../payments") == "/payments");
  BOOST_TEST(normal("/a/b/..") == "/a/");
  BOOST_TEST(normal("/a/.") == "/a/");
  BOOST_TEST(normal("/..") == "/");
  BOOST_TEST(normal("/.well-known/x") == "/.well-known/x");
  BOOST_TEST(normal("/a/..b/c.") == "/a/..b/c.");
  BOOST_TEST(normal("*") == "*");
}

BOOST_AUTO_TEST_CASE(spec_C01_routes_match_the_normalized_path_so_no_spelling_skips_a_route) {
  http::ProxyConfig c;
  c.routes.push_back(route("payments", "/payments", "", "", {"POST"}));
  c.routes.push_back(route("exact", "", "/health"));
  c.routes.push_back(route("catch_all", "/"));
  for (const char* p : {"/%70ayments", "/%70ayments/1", "//payments", "/./payments",
                        "/orders/../payments/1", "/x/%2e%2e/payments"}) {
    BOOST_TEST(matched(c, "h", p, "POST") == "payments", p);
  }
  BOOST_TEST(matched(c, "h", "/h%65alth", "GET") == "exact");
  BOOST_TEST(matched(c, "h", "/payment%73x", "POST") == "payments");   // still a plain prefix
  BOOST_TEST(matched(c, "h", "/pay%2Fments", "POST") == "catch_all");  // `%2F` is no `/`
}
