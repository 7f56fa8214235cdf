// The one place where a Status becomes an HTTP status and an OpenAI-style error body.
//
//   {"error":{"message":"...","type":"invalid_request_error","param":"max_tokens","code":null}}
//
// Mapping (retryable = a client may retry the same request later and expect success):
//   InvalidArgument        400 invalid_request_error    not retryable
//   NotFound               404 invalid_request_error    not retryable (code "model_not_found"
//                                                        when param is "model")
//   TooLarge               413 invalid_request_error    not retryable
//   ResourceExhausted      429 rate_limit_error         retryable, Retry-After
//   Cancelled              499 cancelled_error          not retryable (the client went away)
//   FailedPrecondition     500 server_error             not retryable
//   Internal, DataLoss     500 server_error             retryable (a transient fault upstream)
//   Unavailable            503 service_unavailable      retryable, Retry-After
//   DeadlineExceeded       504 timeout_error            retryable
// A request without a valid API key (router/api_keys.h) is no Status: UnauthorizedError renders
// OpenAI's 401 for it.
// Pure functions; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tandem {

struct HttpError {
  int http_status = 500;
  std::string body;   // the JSON error object (no trailing newline)
  bool retryable = false;
  std::optional<int> retry_after_s;  // Retry-After header value, when set
};

// `status` must be non-OK (an OK status is mapped to 500: a caller bug, reported not hidden).
// `param` names the offending request field; "" renders as null.
HttpError ErrorResponse(const Status& status, std::string_view param = "");

// 401 as OpenAI answers a missing (`key_given` false) or wrong API key: type
// "invalid_request_error", param null, code "invalid_api_key". The key is never quoted back.
// The response also needs the header `WWW-Authenticate: Bearer`.
HttpError UnauthorizedError(bool key_given);

// The HTTP status alone (for metrics labels).
int HttpStatusFor(StatusCode code);

// True for the codes a client should retry (see the table above).
bool IsRetryable(StatusCode code);

}  // namespace tandem
