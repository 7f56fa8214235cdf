// Where Model::Load gets its weights from: "tensor NAME as fp32, of this shape". Names are the
// Hugging Face ones (model.layers.0.self_attn.q_proj.weight), whatever the checkpoint calls them;
// a source converts (dtype, quantization, row order) so that every checkpoint format loads
// through the same code. Implementations: SafetensorsReader (common/model/safetensors.h),
// GgufTensorSource (common/model/gguf_checkpoint.h), and the slices of a loaded model that make
// a tensor-parallel shard (common/engine/tensor_parallel.cc, through Model::FromTensors).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/base/status.h"

namespace tandem {

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // Whether the checkpoint holds tensor `name`.
  virtual bool Has(const std::string& name) const = 0;

  // Writes tensor `name` as fp32 (row-major, HF layout) into `out`, after checking that it
  // exists and has exactly `expected_shape`; `out` has that many elements. Errors name the
  // tensor and its shape (NotFound when absent, InvalidArgument for a wrong shape or a type the
  // source cannot convert); the caller adds the checkpoint's path.
  virtual Status ReadF32(const std::string& name, std::span<const int64_t> expected_shape,
                         std::span<float> out) const = 0;
};

}  // namespace tandem
