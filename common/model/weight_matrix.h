// How the CPU engine stores a weight matrix: fp32, bf16 or f16 elements, row major
// [rows, cols] in HF's [out_features, in_features] layout, so y = x W^T. Arithmetic is always
// fp32: bf16/f16 weights are widened to fp32 as they are read, which halves the bytes a
// memory-bound decode step streams.
//
// WeightMatrix is a non-owning view (the Model owns the bytes); copy it freely. Narrowing rounds
// fp32 to nearest-even (as torch's .to(torch.bfloat16) / .half() do), keeps NaN a NaN and sends
// an overflow to +-inf as torch does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/model/safetensors.h"  // F32ToBF16, F32ToF16

namespace tandem {

enum class WeightDType : uint8_t { kF32, kBF16, kF16 };

// "float32", "bfloat16", "float16".
std::string_view WeightDTypeName(WeightDType dtype);
// Parses a torch dtype name ("float32", "bfloat16", "float16"; also "fp32", "bf16", "fp16",
// "half", "float"); nullopt for anything else.
std::optional<WeightDType> ParseWeightDType(std::string_view name);
size_t WeightDTypeSize(WeightDType dtype);

struct WeightMatrix {
  WeightDType dtype = WeightDType::kF32;
  const void* data = nullptr;  // rows * cols elements of dtype, row major
  int rows = 0;
  int cols = 0;

  size_t bytes() const { return size_t{static_cast<size_t>(rows)} * cols * WeightDTypeSize(dtype); }
  // Address of row r.
  const void* row(int r) const {
    return static_cast<const char*>(data) + size_t{static_cast<size_t>(r)} * cols * WeightDTypeSize(dtype);
  }
};

// The narrowing conversions are safetensors.h's F32ToBF16 and F32ToF16.
float BF16ToF32(uint16_t v);
float F16ToF32(uint16_t v);

// Writes n fp32 values into `out` as `dtype` (out has n * WeightDTypeSize(dtype) bytes).
void ConvertFromF32(const float* in, size_t n, WeightDType dtype, void* out);
// Widens rows [r0, r1) of w to fp32: out gets (r1 - r0) * w.cols floats.
void WeightRowsToF32(const WeightMatrix& w, int r0, int r1, float* out);

}  // namespace tandem
