#include "router/errors.h"

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

// Seconds a client should wait before retrying an overloaded or unready router.
constexpr int kRetryAfterSeconds = 1;

std::string_view ErrorType(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kTooLarge:
      return "invalid_request_error";
    case StatusCode::kResourceExhausted:
      return "rate_limit_error";
    case StatusCode::kUnavailable:
      return "service_unavailable";
    case StatusCode::kDeadlineExceeded:
      return "timeout_error";
    case StatusCode::kCancelled:
      return "cancelled_error";
    default:
      return "server_error";
  }
}

std::string RenderBody(const std::string& message, std::string_view type, nlohmann::json param,
                       nlohmann::json code) {
  nlohmann::json inner;
  inner["message"] = message;
  inner["type"] = std::string(type);
  inner["param"] = std::move(param);
  inner["code"] = std::move(code);
  nlohmann::json body;
  body["error"] = std::move(inner);
  // Messages may quote client bytes that are not valid UTF-8: replace rather than throw.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kTooLarge: return 413;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kCancelled: return 499;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

bool IsRetryable(StatusCode code) {
  switch (code) {
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kInternal:
    case StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

HttpError ErrorResponse(const Status& status, std::string_view param) {
  StatusCode code = status.ok() ? StatusCode::kInternal : status.code();
  std::string message = status.ok() ? "internal error: an OK status reached the error path"
                                    : status.message();
  HttpError error;
  error.http_status = HttpStatusFor(code);
  error.retryable = IsRetryable(code);
  if (code == StatusCode::kResourceExhausted || code == StatusCode::kUnavailable) {
    error.retry_after_s = kRetryAfterSeconds;
  }
  error.body = RenderBody(
      message, ErrorType(code),
      param.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(param)),
      (code == StatusCode::kNotFound && param == "model") ? nlohmann::json("model_not_found")
                                                          : nlohmann::json(nullptr));
  return error;
}

HttpError UnauthorizedError(bool key_given) {
  // OpenAI's wording, less its links (and, for a wrong key, less the masked key it quotes).
  const std::string message =
      key_given ? "Incorrect API key provided."
                : "You didn't provide an API key. You need to provide your API key in an "
                  "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";
  HttpError error;
  error.http_status = 401;
  error.body = RenderBody(message, "invalid_request_error", nullptr, "invalid_api_key");
  return error;
}

}  // namespace tandem
