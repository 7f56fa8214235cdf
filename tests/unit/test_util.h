// Small helpers shared by the unit tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>

namespace tandem::test {

// A fresh directory under the system temp dir, removed when the object dies.
// Polls `condition` every millisecond until it holds (true) or `bound` ran out (false).
inline bool Eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds bound = std::chrono::milliseconds(5000)) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A gate that one thread waits at until another opens it: it tells, without timing anything,
// whether a call waited for work it should have left to another thread (that work waits here;
// the test opens the gate only after the call returned, and a wait that ran out means the call
// held the gate shut by waiting for it).
class Gate {
 public:
  // Waits until Open, at most `bound`; false (and timed_out() from then on) when it ran out.
  bool Wait(std::chrono::milliseconds bound = std::chrono::milliseconds(5000)) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, bound, [this] { return open_; })) return true;
    timed_out_ = true;
    return false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool timed_out() {
    std::lock_guard<std::mutex> lock(mutex_);
    return timed_out_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  bool timed_out_ = false;
};

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("tandem-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& content) const {
    std::filesystem::path file = path_ / name;
    std::ofstream(file) << content;
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, capturing stdout and stderr together; stdin_text (if any) is fed from a
// file. Used to drive the real `tandem` binary and tools such as promtool.
inline CommandResult RunCommand(const std::string& command, const std::string& stdin_text = "") {
  TempDir dir;
  std::string full = command;
  if (!stdin_text.empty()) full += " < '" + dir.Write("stdin", stdin_text) + "'";
  full += " 2>&1";
  CommandResult result;
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace tandem::test
