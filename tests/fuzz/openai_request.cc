// Fuzzes the router's OpenAI request parsing and validation (router/openai_api.h
// ParseApiRequest) on request bodies: the first byte picks /v1/completions or
// /v1/chat/completions, the rest is the body. The served model is make-model's "tiny" checkpoint
// (written once to a temp dir: real byte-level BPE tokenizer, chat template), max_model_len 64.
// Properties: nothing crashes or throws; a refused body is InvalidArgument or NotFound (model)
// with a message; an accepted one has a non-empty prompt of in-vocabulary ids that leaves room
// for max_tokens >= 1 within max_model_len, and renders as a response and a stream chunk that
// are JSON.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/model/make_model.h"
#include "router/openai_api.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace tandem;

constexpr int kMaxModelLen = 64;

const ServedModel& Model() {
  static const ServedModel* model = [] {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("tandem-fuzz-model-" + std::to_string(getpid()));
    MakeModelOptions options;
    options.preset = "tiny";
    Status made = MakeModel(options, dir.string());
    FUZZ_CHECK(made.ok(), made.ToString().c_str());
    StatusOr<ServedModel> loaded = LoadServedModel(dir.string(), "tiny", "auto", kMaxModelLen);
    FUZZ_CHECK(loaded.ok(), loaded.status().ToString().c_str());
    std::filesystem::remove_all(dir);
    return new ServedModel(std::move(loaded).value());
  }();
  return *model;
}

bool IsJson(const std::string& text) {
  return !nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 64 << 10) return 0;
  const ServedModel& model = Model();
  ApiKind kind = data[0] & 1 ? ApiKind::kChatCompletion : ApiKind::kCompletion;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string param;
  StatusOr<ApiRequest> request = ParseApiRequest(kind, body, model, &param);
  if (!request.ok()) {
    StatusCode code = request.status().code();
    FUZZ_CHECK(code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound,
               request.status().ToString().c_str());
    FUZZ_CHECK(!request.status().message().empty(), "a refusal without a message");
    return 0;
  }
  const GenerateRequest& g = request->generate;
  FUZZ_CHECK(!g.prompt_token_ids.empty(), "an accepted request with an empty prompt");
  for (int32_t id : g.prompt_token_ids) {
    FUZZ_CHECK(id >= 0 && id < model.tokenizer.vocab_size(), "a prompt id outside the vocab");
  }
  FUZZ_CHECK(g.sampling.max_tokens >= 1, "max_tokens < 1");
  FUZZ_CHECK(static_cast<int64_t>(g.prompt_token_ids.size()) + g.sampling.max_tokens <=
                 model.max_model_len,
             "prompt + max_tokens exceeds max_model_len");
  FUZZ_CHECK(request->kind == kind, "the kind changed");
  FUZZ_CHECK(g.sampling.ValidateForVocab(model.tokenizer.vocab_size()).ok(),
             "accepted sampling parameters an engine would refuse");
  FUZZ_CHECK(request->n >= 1 && request->n <= kMaxChoices, "n out of range");
  FUZZ_CHECK(IsJson(RenderResponse(*request, "out", "stop", {}, Usage{1, 1})),
             "the response is not JSON");
  StreamDelta delta;
  delta.text = "x";
  FUZZ_CHECK(IsJson(RenderChunk(*request, delta)), "a stream chunk is not JSON");
  return 0;
}
