// Status values for expected failures, and a check macro for broken invariants.
//
// Expected failures (bad request, pool full, peer gone, timeout, bad config) travel as a
// Status or a StatusOr<T>; callers must look at them ([[nodiscard]]). A broken invariant is a
// bug: TANDEM_CHECK aborts with file:line and a message. No exception crosses a module boundary.
//
// Status is cheap when OK (no allocation); an error carries a code and a human message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tandem {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller sent something malformed (HTTP 400)
  kNotFound,            // unknown model, request id, file (HTTP 404)
  kTooLarge,            // prompt or body exceeds a limit (HTTP 413)
  kResourceExhausted,   // no capacity now; retry later (HTTP 429)
  kUnavailable,         // peer gone or not ready; retryable (HTTP 503)
  kDeadlineExceeded,    // timed out (HTTP 504)
  kCancelled,           // the client or operator cancelled
  kDataLoss,            // corrupt or truncated data (file, wire message)
  kFailedPrecondition,  // operation not valid in the current state
  kInternal,            // a bug or an unexpected library error (HTTP 500)
  kPermissionDenied,    // the peer is not allowed this (not a cluster member; not the router)
};
// The largest code: wire decoders refuse anything above it.
inline constexpr StatusCode kLastStatusCode = StatusCode::kPermissionDenied;

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: field 'max_tokens' must be positive"
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status TooLarge(std::string message);
Status ResourceExhausted(std::string message);
Status Unavailable(std::string message);
Status DeadlineExceeded(std::string message);
Status Cancelled(std::string message);
Status DataLoss(std::string message);
Status FailedPrecondition(std::string message);
Status Internal(std::string message);
Status PermissionDenied(std::string message);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) {
      std::fprintf(stderr, "StatusOr constructed from an OK status without a value\n");
      std::abort();
    }
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return Checked(); }
  const T& value() const& { return const_cast<StatusOr*>(this)->Checked(); }
  T&& value() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &const_cast<StatusOr*>(this)->Checked(); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return const_cast<StatusOr*>(this)->Checked(); }

 private:
  T& Checked() {
    if (!value_) {
      std::fprintf(stderr, "StatusOr::value() on error: %s\n", status_.ToString().c_str());
      std::abort();
    }
    return *value_;
  }
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace tandem

// Aborts with file:line, the condition and a message when an invariant does not hold.
#define TANDEM_CHECK(cond, ...)                                                   \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::tandem::CheckFailed(__FILE__, __LINE__, #cond, ::std::string{__VA_ARGS__}); \
  } while (0)

// Returns early from a function returning Status or StatusOr<T> when expr is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::tandem::Status tandem_status_ = (expr);     \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

#define TANDEM_CONCAT_INNER(a, b) a##b
#define TANDEM_CONCAT(a, b) TANDEM_CONCAT_INNER(a, b)
// TANDEM_ASSIGN_OR_RETURN(auto x, MakeX()); declares x or returns the error.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr)                                \
  auto TANDEM_CONCAT(tandem_or_, __LINE__) = (expr);                      \
  if (!TANDEM_CONCAT(tandem_or_, __LINE__).ok())                          \
    return TANDEM_CONCAT(tandem_or_, __LINE__).status();                  \
  lhs = std::move(TANDEM_CONCAT(tandem_or_, __LINE__)).value()
