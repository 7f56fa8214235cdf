// One HTTP GET to host:port that never blocks its caller: the supervisor of `tandem up` probes
// every child's /health (and the router's /ready) from its single thread, so a child that stops
// answering (SIGSTOP, a stuck io thread) delays nothing else.
//
//   HttpProbe probe;
//   probe.Start("127.0.0.1", 9100, "/health", 1.0);
//   ... each turn of the loop:  if (probe.Poll() != HttpProbe::kPending) use probe.result()
//
// Not thread-safe; one owner. The socket is closed when the probe ends (answer, error, timeout),
// at the next Start and in the destructor.
#pragma once

#include <chrono>
#include <string>

namespace tandem {

class HttpProbe {
 public:
  enum Result { kIdle, kPending, kOk, kFailed };

  HttpProbe() = default;
  ~HttpProbe();
  HttpProbe(const HttpProbe&) = delete;
  HttpProbe& operator=(const HttpProbe&) = delete;
  HttpProbe(HttpProbe&& other) noexcept;
  HttpProbe& operator=(HttpProbe&& other) noexcept;

  // Starts GET `path` (any earlier probe is dropped). `host` is an IP address; 0.0.0.0 and ::
  // are probed on loopback. kOk needs a "200" status line within `timeout_s`.
  void Start(const std::string& host, int port, const std::string& path, double timeout_s);
  // Moves the probe on without waiting; returns kPending until it has ended, then its result
  // (also kept in result()). kIdle before the first Start.
  Result Poll();
  Result result() const { return result_; }
  // Why it failed ("timed out after 1 s", "connection refused"); "" when it did not.
  const std::string& error() const { return error_; }

 private:
  void Finish(Result result, const std::string& error);

  int fd_ = -1;
  bool connected_ = false;
  std::string request_;
  size_t sent_ = 0;
  std::string response_;
  std::chrono::steady_clock::time_point deadline_;
  double timeout_s_ = 0;
  Result result_ = kIdle;
  std::string error_;
};

}  // namespace tandem
