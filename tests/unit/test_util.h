// Small helpers shared by the unit tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace tandem::test {

// A fresh directory under the system temp dir, removed when the object dies.
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
