// The router's view of whatever generates tokens: the cluster control plane in production, a
// test double in unit tests. The router validates, tokenizes and renders; a Backend only turns
// prompt token ids into output token ids.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/sampling.h"
#include "common/base/status.h"

namespace tandem {

// One request as the router hands it to a backend. Plain data; copyable.
struct GenerateRequest {
  std::string request_id;  // "cmpl-..." or "chatcmpl-...", unique per router process
  std::string model;       // the served model name
  std::vector<int32_t> prompt_token_ids;
  // Validated. The backend applies eos (unless ignore_eos), stop_token_ids and max_tokens.
  // Stop *strings* are applied by the router (it owns the detokenizer); a backend may ignore
  // `sampling.stop` and will be cancelled when one matches.
  SamplingParams sampling;
  std::string slo_class;  // the "x-tandem-slo-class" header; "" = the model's default SLO
  std::chrono::steady_clock::time_point arrival_time;  // when the router received it
  // The id of a request submitted before with the same prompt (choice 0 of the n choices of one
  // request): a backend places this one on the same instances when they can still take it, so
  // that the prompt's KV is computed and held once. Empty: placed on its own.
  std::string place_with;
};

// One of: tokens (finish_reason unset, error OK), finished (finish_reason set; may carry the
// last tokens), failed (error non-OK; no tokens).
struct BackendEvent {
  std::vector<GeneratedToken> tokens;            // new tokens, in order
  std::optional<std::string> finish_reason;  // "stop" | "length" when the backend finished
  Status error;                              // non-OK: the request failed (the client sees it)
};

// A request class's latency objectives.
struct SloTarget {
  double ttft_s = 0;  // <= 0: no TTFT objective
  double tpot_s = 0;  // <= 0: no TPOT objective
};

// Thread-safe. Callbacks may come from any thread, in order per request (never two at once for
// one request), and stop after the finish or error event. Submit must not block on generation.
class Backend {
 public:
  virtual ~Backend() = default;

  // Accepts the request, or rejects it now with a non-OK status (ResourceExhausted -> 429,
  // Unavailable -> 503, ...); a rejected request gets no callback. on_event may be called
  // before Submit returns (from this or another thread).
  virtual Status Submit(const GenerateRequest& request,
                        std::function<void(BackendEvent)> on_event) = 0;

  // Stops a request (client gone, stop string matched, server stopping). Idempotent; unknown
  // or finished ids are ignored. Callbacks may still arrive for it (at most until its
  // finish/error event), and may run inside this call.
  virtual void Cancel(const std::string& request_id) = 0;

  // True when the backend can take requests (instances registered).
  virtual bool Ready() const = 0;

  // OK when `slo_class` (the x-tandem-slo-class header; "" = the default SLO) names a request
  // class this backend knows; else InvalidArgument naming the header and the value. Submit
  // refuses what this refuses. The default knows only "".
  virtual Status CheckSloClass(const std::string& slo_class) const {
    if (slo_class.empty()) return Status::Ok();
    return InvalidArgument("header x-tandem-slo-class: unknown SLO class '" + slo_class +
                           "' (no classes are configured)");
  }

  // The objectives a request of `slo_class` ("" = the defaults) is judged against now (they
  // follow a SIGHUP reload); nullopt when the backend has none: then the router records no SLO
  // attainment.
  virtual std::optional<SloTarget> SloOf(const std::string& slo_class) const {
    (void)slo_class;
    return std::nullopt;
  }
};

}  // namespace tandem
