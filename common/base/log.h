// Leveled logging to stderr, as text or JSON lines, with timestamps and request ids.
//
//   TANDEM_LOG(kInfo) << "listening on " << port;
//   TANDEM_LOG_REQ(kWarn, request_id) << "pull timed out after " << seconds << " s";
//
// Text:  2026-12-02T13:43:25.123Z INFO  router [req=cmpl-42] prefill.cc:88 message
// JSON:  {"ts":"...","level":"info","role":"router","request_id":"cmpl-42","src":"prefill.cc:88","msg":"..."}
//
// Thread-safe: each line is formatted in the calling thread and written with one write(2).
// A message below the current level costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <sstream>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kText, kJson };

// Parses "debug|info|warn|error" and "text|json".
StatusOr<LogLevel> ParseLogLevel(std::string_view name);
StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// Process-wide settings; call at start-up (safe at any time).
void SetLogLevel(LogLevel level);
void SetLogFormat(LogFormat format);
void SetLogRole(std::string_view role);  // "router", "prefill", ... shown on every line
bool LogEnabled(LogLevel level);

// Formats and writes one line. Prefer the macros.
void WriteLogLine(LogLevel level, std::string_view request_id, const char* file, int line,
                  std::string_view message);

// Escapes a string for a JSON string literal (without the quotes).
std::string JsonEscape(std::string_view text);

class LogMessage {
 public:
  LogMessage(LogLevel level, std::string_view request_id, const char* file, int line)
      : level_(level), request_id_(request_id), file_(file), line_(line) {}
  ~LogMessage() { WriteLogLine(level_, request_id_, file_, line_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::string request_id_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace tandem

#define TANDEM_LOG_REQ(level, request_id)                          \
  if (!::tandem::LogEnabled(::tandem::LogLevel::level)) {          \
  } else                                                           \
    ::tandem::LogMessage(::tandem::LogLevel::level, (request_id), __FILE__, __LINE__).stream()

#define TANDEM_LOG(level) TANDEM_LOG_REQ(level, "")
