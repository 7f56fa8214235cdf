// Dequantizing ggml tensor types to fp32, bit for bit as ggml's dequantize_row_* (and the Python
// `gguf` package's gguf.quants.dequantize, the tests' reference) compute them.
//
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K. Block layouts (little endian,
// `d`/`m`/`dmin` are fp16):
//   Q8_0  32 elements, 34 bytes: d, 32 x int8                         x = d * q
//   Q4_0  32 elements, 18 bytes: d, 16 bytes of nibbles (low nibbles are elements 0-15, high
//         nibbles 16-31)                                              x = d * (q - 8)
//   Q4_1  32 elements, 20 bytes: d, m, nibbles as Q4_0                x = d * q + m
//   Q4_K  256 elements, 144 bytes: d, dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes
//         of nibbles (per 64 elements: 32 bytes, low nibbles first)  x = d*sc * q - dmin*m
//   Q5_K  256 elements, 176 bytes: as Q4_K plus 32 bytes of high bits before the nibbles
//   Q6_K  256 elements, 210 bytes: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8
//         scales, d                                                   x = d * sc * (q - 32)
// Pure functions; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/gguf.h"

namespace tandem {

// True for the types DequantizeToF32 handles.
bool CanDequantize(GgmlType type);
// "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K" (for error messages).
std::string DequantizableTypeNames();

// Converts `count` elements of `type` at `src` (any alignment) to fp32 in `dst`. `count` must
// be a multiple of the type's block and the type one CanDequantize accepts (checked: a violation
// is a bug in the caller and aborts).
void DequantizeToF32(GgmlType type, const uint8_t* src, size_t count, float* dst);

}  // namespace tandem
