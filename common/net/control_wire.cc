#include "common/net/control_wire.h"

#include "common/net/wire_codec.h"

namespace tandem {
namespace {

constexpr size_t kMaxStopTokenIds = 1024;
constexpr size_t kMaxTokensPerMessage = 1u << 16;
constexpr size_t kMaxTopLogprobsOnWire = 64;
constexpr size_t kMaxMessageBytes = 64u << 10;

void PutSampling(WireWriter& w, const SamplingParams& s) {
  w.F32(s.temperature);
  w.I32(s.top_k);
  w.F32(s.top_p);
  w.F32(s.min_p);
  w.F32(s.repetition_penalty);
  w.F32(s.presence_penalty);
  w.F32(s.frequency_penalty);
  w.U8(s.seed.has_value());
  w.U64(s.seed.value_or(0));
  w.I32(s.max_tokens);
  w.I32Array(s.stop_token_ids, kMaxStopTokenIds);
  w.U8(s.ignore_eos);
  w.U8(s.logprobs);
  w.I32(s.top_logprobs);
  w.U8(static_cast<uint8_t>(s.logprobs_mode));
  w.I32(s.min_tokens);
  TANDEM_CHECK(s.logit_bias.size() <= kMaxLogitBiasEntries, "too many logit_bias entries");
  w.U32(static_cast<uint32_t>(s.logit_bias.size()));
  for (const TokenBias& b : s.logit_bias) {
    w.I32(b.token_id);
    w.F32(b.bias);
  }
}

// Ranges are the receiver's SamplingParams::ValidateForVocab; the codec bounds sizes only.
bool GetLogitBias(WireReader& r, std::vector<TokenBias>* bias) {
  uint32_t n = 0;
  if (!r.Count(&n, kMaxLogitBiasEntries, 8)) return false;
  bias->resize(n);
  for (TokenBias& b : *bias)
    if (!r.I32(&b.token_id) || !r.F32(&b.bias)) return false;
  return true;
}

bool GetSampling(WireReader& r, SamplingParams* s) {
  bool has_seed = false;
  uint64_t seed = 0;
  uint8_t mode = 0;
  bool ok = r.F32(&s->temperature) && r.I32(&s->top_k) && r.F32(&s->top_p) && r.F32(&s->min_p) &&
            r.F32(&s->repetition_penalty) && r.F32(&s->presence_penalty) &&
            r.F32(&s->frequency_penalty) && r.Bool(&has_seed) && r.U64(&seed) &&
            r.I32(&s->max_tokens) && r.I32Array(&s->stop_token_ids, kMaxStopTokenIds) &&
            r.Bool(&s->ignore_eos) && r.Bool(&s->logprobs) && r.I32(&s->top_logprobs) &&
            r.U8(&mode) && mode <= static_cast<uint8_t>(LogprobsMode::kProcessed) &&
            r.I32(&s->min_tokens) && GetLogitBias(r, &s->logit_bias);
  if (!ok) return false;
  s->logprobs_mode = static_cast<LogprobsMode>(mode);
  if (has_seed) s->seed = seed;
  else s->seed.reset();
  return true;
}

void PutToken(WireWriter& w, const GeneratedToken& t) {
  w.I32(t.token_id);
  w.F32(t.logprob);
  TANDEM_CHECK(t.top_logprobs.size() <= kMaxTopLogprobsOnWire, "too many top logprobs");
  w.U32(static_cast<uint32_t>(t.top_logprobs.size()));
  for (const auto& [id, lp] : t.top_logprobs) {
    w.I32(id);
    w.F32(lp);
  }
}

bool GetToken(WireReader& r, GeneratedToken* t) {
  uint32_t n = 0;
  if (!r.I32(&t->token_id) || !r.F32(&t->logprob) || !r.Count(&n, kMaxTopLogprobsOnWire, 8))
    return false;
  t->top_logprobs.resize(n);
  for (auto& [id, lp] : t->top_logprobs)
    if (!r.I32(&id) || !r.F32(&lp)) return false;
  return true;
}

constexpr int32_t kMaxLayersOnWire = 1 << 16;

void PutOptionalToken(WireWriter& w, const std::optional<GeneratedToken>& t) {
  w.U8(t.has_value());
  if (t) PutToken(w, *t);
}

bool GetOptionalToken(WireReader& r, std::optional<GeneratedToken>* t) {
  bool present = false;
  if (!r.Bool(&present)) return false;
  t->reset();
  if (!present) return true;
  GeneratedToken token;
  if (!GetToken(r, &token)) return false;
  *t = std::move(token);
  return true;
}

bool ValidLayersReady(int32_t n) {
  return n == kAllLayersReady || (n >= 0 && n <= kMaxLayersOnWire);
}

bool GetCode(WireReader& r, StatusCode* code) {
  uint8_t c = 0;
  if (!r.U8(&c) || c > static_cast<uint8_t>(kLastStatusCode)) return false;
  *code = static_cast<StatusCode>(c);
  return true;
}

struct Encoder {
  std::string operator()(const Hello& m) const {
    WireWriter w = Start(ControlType::kHello);
    w.U8(static_cast<uint8_t>(m.role));
    w.U64(m.instance_id);
    w.Str(m.name, kMaxIdBytes);
    w.Str(m.model, kMaxIdBytes);
    w.Str(m.control_address, kMaxIdBytes);
    w.Str(m.kv_peer_info, kMaxBlobBytes);
    w.I32(m.kv_block_size);
    w.I64(m.kv_total_blocks);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const LoadReport& m) const {
    WireWriter w = Start(ControlType::kLoadReport);
    w.U64(m.instance_id);
    w.I64(m.queued_prefill_tokens);
    w.I32(m.waiting_requests);
    w.I32(m.running_requests);
    w.I64(m.free_kv_blocks);
    w.I64(m.total_kv_blocks);
    w.F64(m.prefill_seconds_per_token);
    w.F64(m.decode_step_seconds);
    w.F64(m.decode_forward_seconds);
    w.F64(m.decode_step_batch);
    w.F64(m.decode_step_context_tokens);
    w.I64(m.context_tokens);
    w.U64(m.last_submit_seq);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const Submit& m) const {
    WireWriter w = Start(ControlType::kSubmit);
    w.Str(m.request_id, kMaxIdBytes);
    w.I32Array(m.prompt, kMaxPromptTokens);
    PutSampling(w, m.sampling);
    w.Str(m.decode_address, kMaxIdBytes);
    w.U64(m.seq);
    w.U64(m.decode_session);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const Cancel& m) const {
    WireWriter w = Start(ControlType::kCancel);
    w.Str(m.request_id, kMaxIdBytes);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const Tokens& m) const {
    WireWriter w = Start(ControlType::kTokens);
    w.Str(m.request_id, kMaxIdBytes);
    TANDEM_CHECK(m.tokens.size() <= kMaxTokensPerMessage, "too many tokens in one message");
    w.U32(static_cast<uint32_t>(m.tokens.size()));
    for (const GeneratedToken& t : m.tokens) PutToken(w, t);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const Finish& m) const {
    WireWriter w = Start(ControlType::kFinish);
    w.Str(m.request_id, kMaxIdBytes);
    w.Str(m.finish_reason, kMaxIdBytes);
    w.U8(static_cast<uint8_t>(m.code));
    w.Str(m.message, kMaxMessageBytes);
    w.I32(m.completion_tokens);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const KvReady& m) const {
    WireWriter w = Start(ControlType::kKvReady);
    w.Str(m.request_id, kMaxIdBytes);
    w.I32Array(m.prompt, kMaxPromptTokens);
    PutOptionalToken(w, m.first_token);
    TANDEM_CHECK(ValidLayersReady(m.layers_ready), "KvReady layers_ready out of range");
    w.I32(m.layers_ready);
    PutSampling(w, m.sampling);
    w.Str(m.kv_descriptor, kMaxBlobBytes);
    w.Str(m.kv_peer_info, kMaxBlobBytes);
    w.U64(m.router_session);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const KvReleased& m) const {
    WireWriter w = Start(ControlType::kKvReleased);
    w.Str(m.request_id, kMaxIdBytes);
    w.U8(static_cast<uint8_t>(m.code));
    w.Str(m.message, kMaxMessageBytes);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const KvTransport& m) const {
    WireWriter w = Start(ControlType::kKvTransport);
    w.Str(m.request_id, kMaxIdBytes);
    w.Str(m.bytes, kMaxBlobBytes);
    return w.Finish(kMaxControlBodyBytes);
  }
  std::string operator()(const KvProgress& m) const {
    WireWriter w = Start(ControlType::kKvProgress);
    w.Str(m.request_id, kMaxIdBytes);
    TANDEM_CHECK(ValidLayersReady(m.layers_ready), "KvProgress layers_ready out of range");
    w.I32(m.layers_ready);
    PutOptionalToken(w, m.first_token);
    w.U8(m.finished);
    return w.Finish(kMaxControlBodyBytes);
  }
  static WireWriter Start(ControlType type) {
    return WireWriter(kControlMagic, kControlVersion, static_cast<uint16_t>(type));
  }
};

template <typename T>
StatusOr<ControlMessage> Done(WireReader& r, bool ok, T message, const char* what) {
  if (!ok) return r.Error(what);
  TANDEM_RETURN_IF_ERROR(r.ExpectEnd(what));
  return ControlMessage(std::move(message));
}

}  // namespace

const char* InstanceRoleName(InstanceRole role) {
  switch (role) {
    case InstanceRole::kRouter: return "router";
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
    case InstanceRole::kColocated: return "colocated";
  }
  return "unknown";
}

std::string EncodeControl(const ControlMessage& message) { return std::visit(Encoder{}, message); }

StatusOr<size_t> ControlFrameBytes(std::span<const uint8_t> header) {
  TANDEM_ASSIGN_OR_RETURN(FrameHeader h, DecodeFrameHeader(header, kControlMagic,
                                                           kMaxControlBodyBytes, "control"));
  if (h.version != kControlVersion)
    return InvalidArgument("control: unsupported version " + std::to_string(h.version));
  return h.frame_bytes;
}

StatusOr<ControlMessage> DecodeControl(std::span<const uint8_t> frame) {
  TANDEM_ASSIGN_OR_RETURN(FrameHeader h, DecodeFrameHeader(frame, kControlMagic,
                                                           kMaxControlBodyBytes, "control"));
  if (h.version != kControlVersion)
    return InvalidArgument("control: unsupported version " + std::to_string(h.version));
  if (frame.size() != h.frame_bytes)
    return DataLoss("control: frame is " + std::to_string(frame.size()) + " bytes, header says " +
                    std::to_string(h.frame_bytes));
  WireReader r(frame.subspan(kFrameHeaderBytes));
  switch (static_cast<ControlType>(h.type)) {
    case ControlType::kHello: {
      Hello m;
      uint8_t role = 0;
      bool ok = r.U8(&role) && role <= static_cast<uint8_t>(InstanceRole::kColocated) &&
                r.U64(&m.instance_id) && r.Str(&m.name, kMaxIdBytes) &&
                r.Str(&m.model, kMaxIdBytes) && r.Str(&m.control_address, kMaxIdBytes) &&
                r.Str(&m.kv_peer_info, kMaxBlobBytes) && r.I32(&m.kv_block_size) &&
                r.I64(&m.kv_total_blocks);
      m.role = static_cast<InstanceRole>(role);
      return Done(r, ok, std::move(m), "control Hello");
    }
    case ControlType::kLoadReport: {
      LoadReport m;
      bool ok = r.U64(&m.instance_id) && r.I64(&m.queued_prefill_tokens) &&
                r.I32(&m.waiting_requests) && r.I32(&m.running_requests) &&
                r.I64(&m.free_kv_blocks) && r.I64(&m.total_kv_blocks) &&
                r.F64(&m.prefill_seconds_per_token) && r.F64(&m.decode_step_seconds) &&
                r.F64(&m.decode_forward_seconds) && r.F64(&m.decode_step_batch) && r.F64(&m.decode_step_context_tokens) &&
                r.I64(&m.context_tokens) && r.U64(&m.last_submit_seq);
      return Done(r, ok, std::move(m), "control LoadReport");
    }
    case ControlType::kSubmit: {
      Submit m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.I32Array(&m.prompt, kMaxPromptTokens) &&
                GetSampling(r, &m.sampling) && r.Str(&m.decode_address, kMaxIdBytes) &&
                r.U64(&m.seq) && r.U64(&m.decode_session);
      return Done(r, ok, std::move(m), "control Submit");
    }
    case ControlType::kCancel: {
      Cancel m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes);
      return Done(r, ok, std::move(m), "control Cancel");
    }
    case ControlType::kTokens: {
      Tokens m;
      uint32_t n = 0;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.Count(&n, kMaxTokensPerMessage, 12);
      if (ok) {
        m.tokens.resize(n);
        for (GeneratedToken& t : m.tokens) ok = ok && GetToken(r, &t);
      }
      return Done(r, ok, std::move(m), "control Tokens");
    }
    case ControlType::kFinish: {
      Finish m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.Str(&m.finish_reason, kMaxIdBytes) &&
                GetCode(r, &m.code) && r.Str(&m.message, kMaxMessageBytes) &&
                r.I32(&m.completion_tokens);
      return Done(r, ok, std::move(m), "control Finish");
    }
    case ControlType::kKvReady: {
      KvReady m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.I32Array(&m.prompt, kMaxPromptTokens) &&
                GetOptionalToken(r, &m.first_token) && r.I32(&m.layers_ready) &&
                ValidLayersReady(m.layers_ready) && GetSampling(r, &m.sampling) &&
                r.Str(&m.kv_descriptor, kMaxBlobBytes) && r.Str(&m.kv_peer_info, kMaxBlobBytes) &&
                r.U64(&m.router_session);
      return Done(r, ok, std::move(m), "control KvReady");
    }
    case ControlType::kKvReleased: {
      KvReleased m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && GetCode(r, &m.code) &&
                r.Str(&m.message, kMaxMessageBytes);
      return Done(r, ok, std::move(m), "control KvReleased");
    }
    case ControlType::kKvTransport: {
      KvTransport m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.Str(&m.bytes, kMaxBlobBytes);
      return Done(r, ok, std::move(m), "control KvTransport");
    }
    case ControlType::kKvProgress: {
      KvProgress m;
      bool ok = r.Str(&m.request_id, kMaxIdBytes) && r.I32(&m.layers_ready) &&
                ValidLayersReady(m.layers_ready) && GetOptionalToken(r, &m.first_token) &&
                r.Bool(&m.finished);
      return Done(r, ok, std::move(m), "control KvProgress");
    }
  }
  return InvalidArgument("control: unknown message type " + std::to_string(h.type));
}

}  // namespace tandem
