// The control plane's messages between the router and the instances, and between a prefill
// and a decode instance (DESIGN.md "One request, end to end"). Framed with common/net/wire_codec.h:
//   u32 magic "TCTL" | u16 version | u16 type | u32 body_bytes | body
//
// Who sends what:
//   instance -> router   Hello (on connect), LoadReport (heartbeat), Tokens, Finish
//   router -> instance   Submit, Cancel
//   prefill -> decode    Hello, KvReady (the request, its first token and where its KV is),
//                        KvProgress (layer-wise streaming: more layers computed, the first
//                        token, or the request ended at its first token)
//   decode -> prefill    KvReleased (pulled or abandoned: the prefill side frees its blocks),
//                        KvTransport (a transport's own message to the publisher: nccl's pull
//                        orders, kvtransfer/nccl_protocol.h)
//   router -> decode     Cancel (stop string hit, client gone)
//
// KV transfer details (kvtransfer's PeerInfo, KvDescriptor) ride as opaque, separately
// versioned blobs, so that common/ does not depend on kvtransfer/.
//
// Decode() never trusts an unchecked length; malformed bytes are DataLoss or InvalidArgument.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/engine/sampling_params.h"
#include "common/base/status.h"

namespace tandem {

inline constexpr uint32_t kControlMagic = 0x4C544354;  // "TCTL" as little-endian bytes
// 2: Submit.seq and LoadReport.last_submit_seq; 3: KvReady carries layers_ready and an optional
// first token, KvProgress; 4: LoadReport.decode_step_batch and decode_step_context_tokens;
// 5: router sessions (Submit.decode_session, KvReady.router_session); 6: SamplingParams
// min_tokens and logit_bias; 7: KvTransport.
inline constexpr uint16_t kControlVersion = 7;
inline constexpr size_t kMaxControlBodyBytes = 32u << 20;
inline constexpr size_t kMaxPromptTokens = 1u << 20;
inline constexpr size_t kMaxIdBytes = 256;
inline constexpr size_t kMaxBlobBytes = 16u << 20;

enum class ControlType : uint16_t {
  kHello = 1,
  kLoadReport = 2,
  kSubmit = 3,
  kCancel = 4,
  kTokens = 5,
  kFinish = 6,
  kKvReady = 7,
  kKvReleased = 8,
  kKvProgress = 9,
  kKvTransport = 10,
};

enum class InstanceRole : uint8_t { kRouter = 0, kPrefill = 1, kDecode = 2, kColocated = 3 };
const char* InstanceRoleName(InstanceRole role);

struct Hello {
  InstanceRole role = InstanceRole::kPrefill;
  uint64_t instance_id = 0;     // random: per process incarnation (instances), per connection
                                // (the router: its session id with that instance)
  std::string name;             // "prefill-0"
  std::string model;            // served model name
  std::string control_address;  // "host:port" where this instance accepts control connections
  std::string kv_peer_info;     // kvtransfer PeerInfo blob (prefill) or empty
  int32_t kv_block_size = 0;
  int64_t kv_total_blocks = 0;
};

// Heartbeat with the numbers the router's placement needs.
struct LoadReport {
  uint64_t instance_id = 0;
  int64_t queued_prefill_tokens = 0;  // prompt tokens waiting for prefill
  int32_t waiting_requests = 0;       // queued (prefill) or waiting for KV/blocks (decode)
  int32_t running_requests = 0;       // in the decode batch
  int64_t free_kv_blocks = 0;
  int64_t total_kv_blocks = 0;
  double prefill_seconds_per_token = 0;  // recent average over prefill batches
  double decode_step_seconds = 0;        // recent average decode step time
  // Over the same steps (without prompt work): the forward pass alone (what a latency model
  // times; no sampling, no waiting for arriving KV), and the average batch size and summed
  // context: the router compares the model's step there with decode_forward_seconds to correct
  // the model (router/placement.h DecodeModelCorrection). 0 = no decode step measured yet.
  double decode_forward_seconds = 0;
  double decode_step_batch = 0;
  double decode_step_context_tokens = 0;
  int64_t context_tokens = 0;            // sum of context lengths in the decode batch
  // The highest Submit::seq this instance had taken into its queue when it computed this report:
  // the requests the router submitted after that are not in the numbers above yet.
  uint64_t last_submit_seq = 0;
};

struct Submit {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;     // stop strings and include_stop_str_in_output are the router's
                               // business and are not sent
  std::string decode_address;  // "host:port" of the chosen decode instance; empty = colocated
  uint64_t seq = 0;            // the router's submit counter for this instance (1, 2, ...)
  // The router's session with the chosen decode instance (the instance_id of the Hello the router
  // sent on that connection); prefill passes it on in KvReady. 0 for colocated (the session is
  // the connection this Submit came on).
  uint64_t decode_session = 0;
};

struct Cancel {
  std::string request_id;
};

struct Tokens {
  std::string request_id;
  std::vector<GeneratedToken> tokens;
};

// The end of a request on an instance: finish_reason "stop"|"length", or a non-OK code.
struct Finish {
  std::string request_id;
  std::string finish_reason;
  StatusCode code = StatusCode::kOk;
  std::string message;
  int32_t completion_tokens = 0;

  Status ToStatus() const { return code == StatusCode::kOk ? Status() : Status(code, message); }
};

// KvReady/KvProgress layers_ready value: every layer of the published blocks is computed.
inline constexpr int32_t kAllLayersReady = -1;

// Prefill -> decode: continue this request. The first token was sampled (and streamed) by
// prefill; decode continues the same sampler stream (same seed, next position).
// Layer-wise streaming (transfer.layerwise): prefill sends KvReady before its forward pass, with
// layers_ready 0 and no first token; KvProgress messages follow. Otherwise layers_ready is
// kAllLayersReady and the first token is set. layers_ready is kAllLayersReady or in [0, 65536].
struct KvReady {
  std::string request_id;
  std::vector<int32_t> prompt;
  std::optional<GeneratedToken> first_token;
  int32_t layers_ready = kAllLayersReady;  // layers [0, layers_ready) may be pulled now
  SamplingParams sampling;
  std::string kv_descriptor;  // kvtransfer KvDescriptor blob
  std::string kv_peer_info;   // kvtransfer PeerInfo blob of the prefill instance
  // Submit.decode_session: the router session that wants this request. Decode refuses the request
  // (releases the KV, sends no tokens) unless that session is open, and drops every request of a
  // session when it closes: the router fails a session's requests when it gives the session up.
  uint64_t router_session = 0;
};

struct KvReleased {
  std::string request_id;
  StatusCode code = StatusCode::kOk;  // non-OK: the pull failed; prefill frees all the same
  std::string message;
};

// Prefill -> decode, after a layer-wise KvReady: layers [0, layers_ready) of the request's
// published blocks are computed (never lower than an earlier message said); first_token once
// sampled. `finished`: the request ended at its first token (prefill sends Finish to the router);
// decode drops it without a Finish and releases the KV once its pull is over. Prefill sends the
// first token or finished only after every layer is ready.
struct KvProgress {
  std::string request_id;
  int32_t layers_ready = kAllLayersReady;
  std::optional<GeneratedToken> first_token;
  bool finished = false;
};

// Decode -> prefill: bytes from the puller of `request_id` for the prefill instance's publisher
// (KvPublisher::OnPullerMessage), opaque here. Sent on the connection the KvReady came on, so
// they arrive in the order the puller made them.
struct KvTransport {
  std::string request_id;
  std::string bytes;
};

using ControlMessage = std::variant<Hello, LoadReport, Submit, Cancel, Tokens, Finish, KvReady,
                                    KvReleased, KvProgress, KvTransport>;

// Encodes one frame. Aborts (TANDEM_CHECK) on values over the limits.
std::string EncodeControl(const ControlMessage& message);

// Decodes exactly one frame (header included).
StatusOr<ControlMessage> DecodeControl(std::span<const uint8_t> frame);

// The frame size from its first kFrameHeaderBytes bytes (for stream readers).
StatusOr<size_t> ControlFrameBytes(std::span<const uint8_t> header);

}  // namespace tandem
