#pragma once
// The header_read_timeout of the client connections of one io thread that read their request
// header in more than one piece (SPEC C07, C54), kept in the thread's deadline list: a slow
// connection costs no timer operation per byte it sends, and ten thousand of them do not fill
// the timer queue that every other request of the thread uses.

#include <boost/asio/ip/tcp.hpp>

#include "gateway/common/deadline_list.hpp"

namespace idemgate::http {

/// One io thread's deadlines of slow request headers.
using HeaderDeadlines = common::DeadlineList;

/// A connection waiting for the rest of its header: when its deadline passes first, its socket
/// is closed, which ends the read waiting on it (`operation_aborted`).
struct SlowHeader : HeaderDeadlines::Entry {
  explicit SlowHeader(boost::asio::ip::tcp::socket& connection,
                      HeaderDeadlines::Clock::time_point until)
      : socket(&connection) {
    deadline = until;
    on_due = [](HeaderDeadlines::Entry& entry) {
      boost::system::error_code ignored;
      static_cast<SlowHeader&>(entry).socket->close(ignored);
    };
  }
  boost::asio::ip::tcp::socket* socket;
};

}  // namespace idemgate::http
