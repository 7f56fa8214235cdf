#include "common/model/weight_matrix.h"

#include <cstring>

namespace tandem {

std::string_view WeightDTypeName(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kF32: return "float32";
    case WeightDType::kBF16: return "bfloat16";
    case WeightDType::kF16: return "float16";
  }
  return "float32";
}

std::optional<WeightDType> ParseWeightDType(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "float") return WeightDType::kF32;
  if (name == "bfloat16" || name == "bf16") return WeightDType::kBF16;
  if (name == "float16" || name == "fp16" || name == "half") return WeightDType::kF16;
  return std::nullopt;
}

size_t WeightDTypeSize(WeightDType dtype) { return dtype == WeightDType::kF32 ? 4 : 2; }

float BF16ToF32(uint16_t v) {
  uint32_t bits = uint32_t{v} << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

float F16ToF32(uint16_t v) {
  const uint32_t sign = uint32_t{static_cast<uint32_t>(v & 0x8000u)} << 16;
  uint32_t exp = (v >> 10) & 0x1fu;
  uint32_t mant = v & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

void ConvertFromF32(const float* in, size_t n, WeightDType dtype, void* out) {
  switch (dtype) {
    case WeightDType::kF32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case WeightDType::kBF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = F32ToBF16(in[i]);
      return;
    }
    case WeightDType::kF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = F32ToF16(in[i]);
      return;
    }
  }
}

void WeightRowsToF32(const WeightMatrix& w, int r0, int r1, float* out) {
  const size_t n = size_t{static_cast<size_t>(r1 - r0)} * w.cols;
  switch (w.dtype) {
    case WeightDType::kF32:
      std::memcpy(out, w.row(r0), n * sizeof(float));
      return;
    case WeightDType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(w.row(r0));
      for (size_t i = 0; i < n; ++i) out[i] = BF16ToF32(in[i]);
      return;
    }
    case WeightDType::kF16: {
      const auto* in = static_cast<const uint16_t*>(w.row(r0));
      for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(in[i]);
      return;
    }
  }
}

}  // namespace tandem
