// The load generator's HTTP side: sends WorkloadRequests to a Tandem router (or any
// OpenAI-compatible server) as streaming /v1/completions and measures each one.
//
// Each request is one POST /v1/completions on its own TCP connection ("Connection: close") with
// "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
// "temperature": 0 and "prompt" as token ids (synthetic: seeded ids from the request id, the
// same on every run) or the trace's text / ids. Timing, per request, from the moment its
// connect starts:
//   TTFT  first SSE event whose choice carries text (or the finish, when no text came first);
//         the router sends an event as soon as a token decodes to text, so a token that ends
//         inside a UTF-8 character shows up with the next one
//   e2e   "data: [DONE]" (a 200 stream that ends without it is a failed request)
//   output_tokens  usage.completion_tokens of the final usage event; the number of text events
//         when the server sends no usage
// A non-200 answer is rejected (429) or failed (error = "HTTP <status>: <body>"); an error
// event inside the stream, a connection error or the request timeout fail the request.
//
// Open loop (rate mode): request i is sent at its arrival_s whatever happened to earlier ones.
// Closed loop (concurrency mode): C requests in flight, the next sent when one finishes.
// Everything runs on the calling thread (one io_context); RunLoad blocks until every sent
// request has finished or timed out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/workload.h"
#include "common/base/status.h"

namespace tandem {

// "http://HOST:PORT" (a trailing "/" allowed; no path, no https).
struct ServerUrl {
  std::string host;
  std::string port;
};
StatusOr<ServerUrl> ParseServerUrl(const std::string& url);

struct ServedModelInfo {
  std::string name;
  int max_model_len = 0;  // 0 when the server does not say
};
// GET `path` (e.g. "/metrics"); the body of a 200 answer, else Unavailable naming the URL and
// the status. Bounded by timeout_s.
StatusOr<std::string> HttpGet(const ServerUrl& url, const std::string& path, double timeout_s);

// GET /v1/models; the first entry. Bounded by timeout_s.
StatusOr<ServedModelInfo> FetchModelInfo(const ServerUrl& url, double timeout_s);

struct LoadOptions {
  ServerUrl url;
  std::string model;               // the "model" field of every request
  int concurrency = 0;             // > 0: closed loop with this many in flight; 0: open loop
  double duration_s = 0;           // > 0: send nothing after this many seconds
  double request_timeout_s = 600;  // connect to [DONE], per request
  uint64_t seed = 1;               // synthetic prompt ids
  int32_t min_token_id = 100;      // synthetic prompt ids are uniform in [min, max)
  int32_t max_token_id = 1000;
  bool progress = false;  // one-line progress on stderr, rewritten in place
};

struct LoadResult {
  // One per request sent, in request order; arrival_s = when it was sent (since the start).
  std::vector<RequestOutcome> outcomes;
  std::vector<int32_t> max_tokens;  // beside outcomes
  double duration_s = 0;            // start to the last request's end
};

// Runs the load. Requests without a known prompt (no text, no ids, prompt_tokens < 1) are
// an InvalidArgument before anything is sent; so is a bad url.
StatusOr<LoadResult> RunLoad(const LoadOptions& options,
                             const std::vector<WorkloadRequest>& requests);

// The synthetic prompt of request `id`: `length` ids, seeded by (seed, id).
std::vector<int32_t> SyntheticPrompt(uint64_t seed, int64_t id, int32_t length, int32_t min_id,
                                     int32_t max_id);

}  // namespace tandem
