// A preloaded library (LD_PRELOAD) that makes accept() and accept4() of a child process fail
// with EMFILE or ENFILE while a control file says so, leaving the connection in the listen
// backlog, as the kernel does when the process or the system is out of descriptors (SPEC C52).
//
//   IDEMGATE_FAIL_ACCEPT=FILE   while FILE exists and starts with `EMFILE` or `ENFILE`, every
//                               accept fails with that errno; otherwise accept is the real one.
//
// Tests use it instead of exhausting the child's descriptors for real: a process built with
// UBSan's vptr check needs a free descriptor for each check its cache cannot answer (it probes
// memory through a pipe), and the check is fatal (-fno-sanitize-recover), so a sanitized
// gateway truly out of descriptors is killed by its sanitizer rather than by anything it does.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

/// The errno to fail with now, or 0.
int injected_error() {
  const char* path = std::getenv("IDEMGATE_FAIL_ACCEPT");
  if (!path || !*path) return 0;
  const int saved = errno;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  int error = 0;
  if (fd >= 0) {
    char word[8] = {};
    if (::read(fd, word, sizeof word - 1) > 0) {
      if (std::strncmp(word, "EMFILE", 6) == 0) error = EMFILE;
      if (std::strncmp(word, "ENFILE", 6) == 0) error = ENFILE;
    }
    ::close(fd);
  }
  errno = saved;
  return error;
}

using Accept4 = int (*)(int, sockaddr*, socklen_t*, int);

Accept4 real_accept4() {
  static const auto real = reinterpret_cast<Accept4>(::dlsym(RTLD_NEXT, "accept4"));
  return real;
}

}  // namespace

extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  if (const int error = injected_error()) {
    errno = error;
    return -1;
  }
  return real_accept4()(fd, addr, len, flags);
}

extern "C" int accept(int fd, sockaddr* addr, socklen_t* len) {
  return accept4(fd, addr, len, 0);
}
