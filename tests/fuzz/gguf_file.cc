// Fuzzes GGUF parsing (common/model/gguf.h GgufFile::FromBytes, the parser GgufFile::Open runs on
// the mapped file) and what a checkpoint load does next with an accepted file: the model config
// (ModelConfigFromGguf), the vocabulary (GgufVocabFromFile) and dequantizing tensors through
// GgufTensorSource. Properties: nothing crashes or reads outside the input; every refusal names
// the file; every tensor of an accepted file lies inside the input, aligned, with as many bytes
// as its dims and type say; an accepted config has positive sizes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "common/model/gguf_checkpoint.h"
#include "common/model/gguf_quants.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr uint64_t kMaxDequantElements = 1 << 16;

bool NamesFile(const tandem::Status& s) { return s.message().rfind("f.gguf: ", 0) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  StatusOr<GgufFile> file = GgufFile::FromBytes(data, size, "f.gguf");
  if (!file.ok()) {
    FUZZ_CHECK(NamesFile(file.status()), "a refusal that does not name the file");
    return 0;
  }
  for (const auto& [key, value] : file->metadata()) {
    (void)value.ToString();
    for (size_t i = 0; i < value.array_size() && i < 4; ++i) {
      (void)value.IntAt(i);
      (void)value.FloatAt(i);
      (void)value.StringAt(i);
    }
  }
  for (const GgufTensorInfo& t : file->tensors()) {
    const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(t.type));
    FUZZ_CHECK(info != nullptr, "a tensor of an unknown type was accepted");
    FUZZ_CHECK(t.num_elements % info->block_elements == 0, "a partial block");
    FUZZ_CHECK(t.size_bytes == t.num_elements / info->block_elements * info->block_bytes,
               "size_bytes does not match dims and type");
    FUZZ_CHECK(t.data >= data + file->data_offset() && t.data + t.size_bytes <= data + size,
               "a tensor outside the input");
    FUZZ_CHECK(t.offset % file->alignment() == 0, "a misaligned tensor");
    if (CanDequantize(t.type) && t.num_elements <= kMaxDequantElements) {
      std::vector<float> out(t.num_elements);
      DequantizeToF32(t.type, t.data, out.size(), out.data());
    }
  }
  StatusOr<GgufVocab> vocab = GgufVocabFromFile(*file);
  if (!vocab.ok()) FUZZ_CHECK(NamesFile(vocab.status()), "a vocab refusal without the file");
  StatusOr<ModelConfig> config = ModelConfigFromGguf(*file);
  if (!config.ok()) {
    FUZZ_CHECK(NamesFile(config.status()), "a config refusal without the file");
    return 0;
  }
  FUZZ_CHECK(config->num_layers > 0 && config->hidden_size > 0 && config->num_heads > 0 &&
                 config->num_kv_heads > 0 && config->head_dim > 0 && config->vocab_size > 0 &&
                 config->num_heads % config->num_kv_heads == 0,
             "an accepted config with a non-positive size");
  // Read layer 0's and the global tensors as Model::Load would, each with its own shape (the
  // expected shape is Model::Load's business; here the conversion and the un-permute run).
  GgufTensorSource source(std::move(*file), *config);
  for (const char* name :
       {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.down_proj.weight"}) {
    if (!source.Has(name)) continue;
    // The named tensor's shape is one of the file's: reading with each shape in turn reads it
    // once (the others are shape mismatches, statuses).
    for (const GgufTensorInfo& t : source.file().tensors()) {
      if (t.num_elements > kMaxDequantElements) continue;
      std::vector<float> out(t.num_elements);
      Status s = source.ReadF32(name, t.Shape(), out);
      (void)s;  // a wrong shape or type is a status; only crashes matter here
    }
  }
  return 0;
}
