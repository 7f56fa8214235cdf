#include "common/base/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace tandem {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
std::mutex g_role_mutex;  // guards g_role; only touched at start-up and per line copy
std::string g_role = "tandem";

const char* LevelName(LogLevel level, bool upper) {
  switch (level) {
    case LogLevel::kDebug: return upper ? "DEBUG" : "debug";
    case LogLevel::kInfo: return upper ? "INFO " : "info";
    case LogLevel::kWarn: return upper ? "WARN " : "warn";
    case LogLevel::kError: return upper ? "ERROR" : "error";
  }
  return "?";
}

std::string Timestamp() {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count()));
  return buf;
}

std::string_view BaseName(const char* file) {
  std::string_view path(file);
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return InvalidArgument("log level must be debug|info|warn|error, got '" + std::string(name) + "'");
}

StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return InvalidArgument("log format must be text|json, got '" + std::string(name) + "'");
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }
void SetLogRole(std::string_view role) {
  std::lock_guard<std::mutex> lock(g_role_mutex);
  g_role = role;
}
bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

void WriteLogLine(LogLevel level, std::string_view request_id, const char* file, int line,
                  std::string_view message) {
  std::string role;
  {
    std::lock_guard<std::mutex> lock(g_role_mutex);
    role = g_role;
  }
  std::string src = std::string(BaseName(file)) + ":" + std::to_string(line);
  std::string out;
  if (static_cast<LogFormat>(g_format.load()) == LogFormat::kJson) {
    out = "{\"ts\":\"" + Timestamp() + "\",\"level\":\"" + LevelName(level, false) +
          "\",\"role\":\"" + JsonEscape(role) + "\"";
    if (!request_id.empty()) out += ",\"request_id\":\"" + JsonEscape(request_id) + "\"";
    out += ",\"src\":\"" + JsonEscape(src) + "\",\"msg\":\"" + JsonEscape(message) + "\"}\n";
  } else {
    out = Timestamp() + " " + LevelName(level, true) + " " + role + " ";
    if (!request_id.empty()) out += "[req=" + std::string(request_id) + "] ";
    out += src + " ";
    out += message;
    out += "\n";
  }
  // One write per line so that concurrent lines never interleave.
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(STDERR_FILENO, out.data() + done, out.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

}  // namespace tandem
