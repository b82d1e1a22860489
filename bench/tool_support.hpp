#pragma once
// What the helpers of scripts/bench share: reading their command line, percentiles of their
// samples, and ending a run when scripts/bench closes the pipe on their stdin.

#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/program_options.hpp>
#include <cstddef>
#include <exception>
#include <functional>
#include <iostream>
#include <utility>
#include <vector>

namespace idemgate::bench {

/// Parses the command line into the variables `options` names. On an error prints it and the
/// usage to stderr and returns false (the helper then exits with 2).
inline bool parse_options(int argc, char** argv,
                          const boost::program_options::options_description& options) {
  namespace po = boost::program_options;
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n" << options;
    return false;
  }
  return true;
}

/// The value at `fraction` (0 to 1) of the way through `values` in order (0 when empty);
/// reorders `values`.
inline double percentile(std::vector<double>& values, double fraction) {
  if (values.empty()) return 0;
  const auto index = static_cast<std::size_t>(fraction * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index),
                   values.end());
  return values[index];
}

/// Calls `on_eof` on `io`'s thread once stdin reaches its end (or fails), discarding whatever
/// arrives before it: scripts/bench ends a helper's run by closing the pipe on its stdin.
/// `on_eof` typically prints the figures and stops `io`. Destroy the watch before `io`.
class StdinWatch {
 public:
  StdinWatch(boost::asio::io_context& io, std::function<void()> on_eof)
      : input_(io, ::dup(STDIN_FILENO)), on_eof_(std::move(on_eof)) {
    read();
  }
  StdinWatch(const StdinWatch&) = delete;
  StdinWatch& operator=(const StdinWatch&) = delete;

 private:
  void read() {
    input_.async_read_some(boost::asio::buffer(sink_),
                           [this](boost::system::error_code ec, std::size_t) {
                             if (ec) {
                               on_eof_();
                               return;
                             }
                             read();
                           });
  }

  boost::asio::posix::stream_descriptor input_;
  std::function<void()> on_eof_;
  char sink_[256];
};

}  // namespace idemgate::bench
