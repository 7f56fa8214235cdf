// Writes the seed corpora of the binary formats with Tandem's own encoders (control_wire,
// kv_wire, safetensors_header, model_config); the text formats' seeds are written by hand.
// Built in the fuzz build (fuzz_make_seeds); run from the repository root:
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/model/make_model.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/net/control_auth.h"
#include "common/net/control_wire.h"
#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/wire.h"

namespace {

using namespace tandem;
namespace fs = std::filesystem;

void Put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  Status s = WriteStringToFile((dir / name).string(), bytes);
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
}

SamplingParams Sampling() {
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.top_p = 0.9f;
  s.seed = 1234;
  s.max_tokens = 32;
  s.stop_token_ids = {2, 7};
  s.logprobs = true;
  s.top_logprobs = 2;
  s.min_tokens = 3;
  s.logit_bias = {{5, 100.0f}, {9, -2.5f}};
  return s;
}

GeneratedToken Token() { return GeneratedToken{42, -0.5f, {{42, -0.5f}, {7, -1.25f}}}; }

void ControlSeeds(const fs::path& dir) {
  Put(dir, "hello", EncodeControl(Hello{InstanceRole::kPrefill, 77, "prefill-0", "tiny",
                                        "127.0.0.1:9000", "peerinfo", 16, 1024}));
  LoadReport report;
  report.instance_id = 77;
  report.queued_prefill_tokens = 300;
  report.waiting_requests = 2;
  report.decode_step_seconds = 0.02;
  report.last_submit_seq = 9;
  Put(dir, "load_report", EncodeControl(report));
  Put(dir, "submit", EncodeControl(Submit{"cmpl-1", {1, 2, 3, 4}, Sampling(),
                                          "127.0.0.1:9001", 3, 88}));
  Put(dir, "cancel", EncodeControl(Cancel{"cmpl-1"}));
  Put(dir, "tokens", EncodeControl(Tokens{"cmpl-1", {Token(), GeneratedToken{5, 0, {}}}}));
  Put(dir, "finish", EncodeControl(Finish{"cmpl-1", "stop", StatusCode::kOk, "", 12}));
  Put(dir, "finish_error",
      EncodeControl(Finish{"cmpl-2", "", StatusCode::kUnavailable, "peer gone", 0}));
  Put(dir, "kv_ready", EncodeControl(KvReady{"cmpl-1", {1, 2, 3}, Token(), kAllLayersReady,
                                             Sampling(), "descriptor", "peerinfo", 88}));
  Put(dir, "kv_ready_layerwise", EncodeControl(KvReady{"cmpl-3", {1, 2}, std::nullopt, 0,
                                                       SamplingParams{}, "d", "p", 1}));
  Put(dir, "kv_released", EncodeControl(KvReleased{"cmpl-1", StatusCode::kDataLoss, "pull"}));
  Put(dir, "kv_progress", EncodeControl(KvProgress{"cmpl-3", 4, std::nullopt, false}));
  Put(dir, "kv_progress_done", EncodeControl(KvProgress{"cmpl-3", -1, Token(), true}));
  Put(dir, "kv_transport", EncodeControl(KvTransport{"cmpl-4", std::string("order\0\x01", 7)}));
  AuthNonce nonce{};
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(i * 7);
  auto challenge = EncodeAuthChallenge(nonce);
  Put(dir, "auth_challenge", std::string(challenge.begin(), challenge.end()));
}

void KvSeeds(const fs::path& dir) {
  Put(dir, "peer_info", Encode(PeerInfo{99, "ucx", "worker-address", "rkey", 0x7f0000000000,
                                        1 << 20}));
  Put(dir, "peer_info_inprocess", Encode(PeerInfo{1, "inprocess", "", "", 0, 0}));
  StatusOr<KvDescriptor> d = MakeDescriptor(99, "cmpl-1", {{{0, 64}, {128, 64}}, {{4096, 128}}});
  if (d.ok()) Put(dir, "kv_descriptor", Encode(*d));
  Put(dir, "transfer_result", Encode(TransferResult{99, "cmpl-1", StatusCode::kOk, "", 256}));
  if (d.ok()) {
    NcclPullOrder order;
    order.descriptor = *d;
    order.local_shape = KvPoolShape{KvLayout{2, 4, 8, 4}, 2, 16};
    order.local = {{{512, 128}}, {{1024, 128}}};
    order.first_layer = 0;
    order.end_layer = 2;
    order.pairs = {{0, 0, std::string(kNcclUniqueIdBytes, '\x02'), 3},
                   {0, 1, std::string(kNcclUniqueIdBytes, '\x03'), 0}};
    Put(dir, "nccl_pull_order", Encode(order));
  }
  Put(dir, "transfer_result_error",
      Encode(TransferResult{99, "cmpl-2", StatusCode::kDeadlineExceeded, "pull timed out", 0}));
}

void SafetensorsSeeds(const fs::path& dir) {
  fs::create_directories(dir);
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 65504.0f, -1e-8f};
  std::vector<TensorToWrite> tensors = {
      {"model.embed_tokens.weight", {2, 3}, a, DType::kF32},
      {"model.norm.weight", {6}, a, DType::kBF16},
      {"lm_head.weight", {3, 2}, a, DType::kF16},
  };
  (void)WriteSafetensors((dir / "three_dtypes").string(), tensors);
  std::vector<TensorToWrite> one = {{"scalar", {}, std::span<const float>(a).first(1), DType::kF32}};
  (void)WriteSafetensors((dir / "scalar").string(), one);
}

void ModelConfigSeeds(const fs::path& dir) {
  for (auto [family, name] : {std::pair{ModelFamily::kLlama, "llama"},
                              std::pair{ModelFamily::kQwen2, "qwen2"}}) {
    StatusOr<ModelConfig> c = PresetConfig("tiny", family);
    if (c.ok()) Put(dir, std::string("tiny_") + name + ".json", ModelConfigToJson(*c));
  }
  StatusOr<ModelConfig> c = PresetConfig("small", ModelFamily::kLlama);
  if (c.ok()) {
    c->rope_scaling = RopeScaling{RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
    c->eos_token_ids = {128001, 128009};
    Put(dir, "llama3_rope.json", ModelConfigToJson(*c));
    c->family = ModelFamily::kMistral;
    c->architecture = "MistralForCausalLM";
    c->sliding_window = 4096;
    c->rope_scaling = RopeScaling{};
    Put(dir, "mistral.json", ModelConfigToJson(*c));
  }
  Put(dir, "generation_config.json",
      "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"do_sample\": true,\n"
      " \"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": 50, \"repetition_penalty\": 1.1}\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  fs::path root = argv[1];
  ControlSeeds(root / "control_wire");
  KvSeeds(root / "kv_wire");
  SafetensorsSeeds(root / "safetensors_header");
  ModelConfigSeeds(root / "model_config");
  return 0;
}
