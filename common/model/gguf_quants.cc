#include "common/model/gguf_quants.h"

#include <cstring>

#include "common/model/safetensors.h"

namespace tandem {
namespace {

constexpr GgmlType kDequantizable[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                                       GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                       GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
constexpr int kQK = 256;  // elements per K-quant super-block

float Half(const uint8_t* p) {
  float out;
  ConvertToF32(DType::kF16, p, 1, &out);
  return out;
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>((qs[i] & 0x0f) - 8);
    y[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    const float lo = d * static_cast<float>(qs[i] & 0x0f);
    const float hi = d * static_cast<float>(qs[i] >> 4);
    y[i] = lo + m;
    y[i + 16] = hi + m;
  }
}

// The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block (ggml's get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K (qh == nullptr) and Q5_K share everything but the fifth bit.
void DequantQ45K(const uint8_t* b, bool five_bits, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = five_bits ? b + 16 : nullptr;
  const uint8_t* qs = b + (five_bits ? 48 : 16);
  for (int j = 0; j < 8; ++j) {  // 8 sub-blocks of 32; pairs share 32 bytes of nibbles
    uint8_t sc, m;
    ScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0f;
      if (qh != nullptr) v |= ((qh[l] >> j) & 1) << 4;
      const float scaled = d1 * static_cast<float>(v);
      y[j * 32 + l] = scaled - m1;
    }
  }
}

void DequantQ6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  // Element e = 128*h + 32*k + l (h: half, k: quarter, l < 32): low nibble from
  // ql[64*h + 32*(k&1) + l] (high nibble when k >= 2), two high bits from qh[32*h + l] >> 2k.
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, k = (e / 32) % 4, l = e % 32;
    const uint8_t low = ql[64 * h + 32 * (k & 1) + l];
    const int q = ((k < 2 ? low & 0x0f : low >> 4) | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
    const float ds = d * static_cast<float>(sc[e / 16]);
    y[e] = ds * static_cast<float>(q);
  }
}

}  // namespace

bool CanDequantize(GgmlType type) {
  for (GgmlType t : kDequantizable) {
    if (t == type) return true;
  }
  return false;
}

std::string DequantizableTypeNames() {
  std::string out;
  for (GgmlType t : kDequantizable) {
    if (!out.empty()) out += ", ";
    out += FindGgmlType(static_cast<uint32_t>(t))->name;
  }
  return out;
}

void DequantizeToF32(GgmlType type, const uint8_t* src, size_t count, float* dst) {
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  TANDEM_CHECK(info != nullptr && CanDequantize(type), "DequantizeToF32 of an unsupported type");
  TANDEM_CHECK(count % info->block_elements == 0, "DequantizeToF32 of a partial block");
  const size_t blocks = count / info->block_elements;
  if (count == 0) return;  // dst may be null then
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, count * sizeof(float)); return;
    case GgmlType::kF16: ConvertToF32(DType::kF16, src, count, dst); return;
    case GgmlType::kBF16: ConvertToF32(DType::kBF16, src, count, dst); return;
    default: break;
  }
  for (size_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * info->block_bytes;
    float* y = dst + i * info->block_elements;
    switch (type) {
      case GgmlType::kQ8_0: DequantQ8_0(b, y); break;
      case GgmlType::kQ4_0: DequantQ4_0(b, y); break;
      case GgmlType::kQ4_1: DequantQ4_1(b, y); break;
      case GgmlType::kQ4_K: DequantQ45K(b, /*five_bits=*/false, y); break;
      case GgmlType::kQ5_K: DequantQ45K(b, /*five_bits=*/true, y); break;
      case GgmlType::kQ6_K: DequantQ6K(b, y); break;
      default: TANDEM_CHECK(false, "unreachable");
    }
  }
}

}  // namespace tandem
