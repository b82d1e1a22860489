#include "gateway/config/config_loader.hpp"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "gateway/config/loader.hpp"

namespace idemgate::config {

ConfigError::ConfigError(std::string file, int line, std::string key, std::string problem)
    : std::runtime_error(file + ":" + std::to_string(line) + ": " + key + ": " + problem),
      file_(std::move(file)),
      line_(line),
      key_(std::move(key)),
      problem_(std::move(problem)) {}

namespace detail {
namespace {

/// Parser events that only note where the root node of a stream's second document starts.
class DocumentCounter final : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> second_start() const { return second_; }
  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (documents_ == 2 && !second_) second_ = mark;
  }
  int documents_ = 0;
  std::optional<YAML::Mark> second_;
};

}  // namespace

std::shared_ptr<Config> Loader::load(const std::string& text) {
  // Not YAML::LoadAll: yaml-cpp 0.7 yields empty documents without end, allocating for each,
  // when a ',' stands where a document's root node should start (`{listen: …},`, a lone `,`).
  // The first document is loaded; the stream is only parsed far enough to see a second one.
  std::vector<YAML::Node> docs;
  std::optional<YAML::Mark> second;
  try {
    docs.push_back(YAML::Load(text));
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter counter;
    if (parser.HandleNextDocument(counter) && parser.HandleNextDocument(counter)) {
      second = counter.second_start();
    }
  } catch (const YAML::Exception& e) {
    fail(e.mark.is_null() ? 1 : e.mark.line + 1, "(syntax)", e.msg);
  }
  if (docs.empty() || docs[0].IsNull()) {
    fail(1, "",
         "the document is empty; expected a mapping with listen, storage, upstreams, routes");
  }
  if (second) fail(second->line + 1, "", "expected one YAML document, found more");

  config_ = std::make_shared<Config>();
  config_->source_file = file_;
  const Field root{docs[0], "", docs[0].Mark().line + 1};
  const Map top(*this, root, names_of(top_keys()));

  const Field listen_field = top.require("listen");
  read_listen(*this, listen_field, config_->listen, false);
  const auto admin_field = top.get("admin");
  if (admin_field) read_listen(*this, *admin_field, config_->admin, true);
  {
    const Listen& l = config_->listen;
    const Listen& a = config_->admin;
    auto wildcard = [](const std::string& addr) { return addr == "0.0.0.0" || addr == "::"; };
    if (l.port != 0 && l.port == a.port &&
        (l.address == a.address || wildcard(l.address) || wildcard(a.address))) {
      const Field& where = admin_field ? *admin_field : listen_field;
      fail(where.line, join(where.path, "port"),
           "listen and admin use the same port " + std::to_string(l.port));
    }
  }

  if (auto f = top.get("threads")) {
    config_->threads = static_cast<int>(integer(*f, 0, 256));
  }
  if (config_->threads == 0) {
    config_->threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (auto f = top.get("limits")) read_limits(*this, *f, config_->limits);
  // Before routes: a route's key must not come from a generated request id.
  if (auto f = top.get("request_id")) read_request_id(*this, *f, config_->request_id);
  read_storage(*this, top.require("storage"));
  read_upstreams(*this, top.require("upstreams"));
  read_routes(*this, top.require("routes"));
  return config_;
}

}  // namespace detail

namespace {

std::filesystem::path directory_of(const std::string& file) {
  return std::filesystem::path(file).parent_path();
}

}  // namespace

std::shared_ptr<const Config> load_config_from_string(const std::string& text,
                                                      const std::string& name) {
  detail::Loader loader(name, directory_of(name));
  return loader.load(text);
}

std::shared_ptr<const Config> load_config(const std::string& path) {
  if (detail::is_special_file(path))
    throw ConfigError(path, 1, "(file)", "cannot read: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(path, 1, "(file)", std::string("cannot read: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path, 1, "(file)", "read error");
  return load_config_from_string(text.str(), path);
}

}  // namespace idemgate::config
