#include "cluster/launcher_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace tandem {

HttpProbe::~HttpProbe() {
  if (fd_ >= 0) ::close(fd_);
}

HttpProbe::HttpProbe(HttpProbe&& other) noexcept { *this = std::move(other); }

HttpProbe& HttpProbe::operator=(HttpProbe&& other) noexcept {
  if (this == &other) return *this;
  if (fd_ >= 0) ::close(fd_);
  fd_ = std::exchange(other.fd_, -1);
  connected_ = other.connected_;
  request_ = std::move(other.request_);
  sent_ = other.sent_;
  response_ = std::move(other.response_);
  deadline_ = other.deadline_;
  timeout_s_ = other.timeout_s_;
  result_ = std::exchange(other.result_, kIdle);
  error_ = std::move(other.error_);
  return *this;
}

void HttpProbe::Finish(Result result, const std::string& error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  result_ = result;
  error_ = error;
}

void HttpProbe::Start(const std::string& host, int port, const std::string& path,
                      double timeout_s) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connected_ = false;
  sent_ = 0;
  response_.clear();
  error_.clear();
  result_ = kPending;
  timeout_s_ = timeout_s;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(timeout_s));
  request_ = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";

  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (host != "::" && ::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof *v6;
  } else {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    if (host == "0.0.0.0" || host == "::" ||
        ::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) != 1)
      v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    length = sizeof *v4;
  }
  fd_ = ::socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return Finish(kFailed, std::strerror(errno));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&storage), length) == 0) {
    connected_ = true;
  } else if (errno != EINPROGRESS) {
    Finish(kFailed, std::strerror(errno));
  }
}

HttpProbe::Result HttpProbe::Poll() {
  if (result_ != kPending) return result_;
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline_) {
      char text[64];
      std::snprintf(text, sizeof text, "no answer within %g s", timeout_s_);
      Finish(kFailed, text);
      return result_;
    }
    pollfd p{fd_, static_cast<short>(connected_ && sent_ == request_.size() ? POLLIN : POLLOUT),
             0};
    if (::poll(&p, 1, 0) <= 0) return result_;  // nothing to do yet
    if (!connected_) {
      int error = 0;
      socklen_t size = sizeof error;
      ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size);
      if (error != 0) {
        Finish(kFailed, std::strerror(error));
        return result_;
      }
      connected_ = true;
      continue;
    }
    if (sent_ < request_.size()) {
      ssize_t n = ::send(fd_, request_.data() + sent_, request_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        Finish(kFailed, std::strerror(errno));
        return result_;
      }
      if (n > 0) sent_ += static_cast<size_t>(n);
      continue;
    }
    char buffer[256];
    ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return result_;
    if (n > 0) response_.append(buffer, static_cast<size_t>(n));
    // The status line is all we need: "HTTP/1.1 200 OK".
    const size_t line_end = response_.find("\r\n");
    if (line_end != std::string::npos || n <= 0) {
      const std::string line = response_.substr(0, line_end);
      if (line.size() >= 12 && line.compare(8, 4, " 200") == 0) Finish(kOk, "");
      else Finish(kFailed, line.empty() ? "connection closed without an answer" : "answered '" + line + "'");
      return result_;
    }
  }
}

}  // namespace tandem
