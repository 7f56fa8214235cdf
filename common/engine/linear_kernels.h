// The CPU engine's linear layers for decode: y = x W^T over fp32 activations and fp32, bf16 or
// f16 weights (common/model/weight_matrix.h), fp32 arithmetic.
//
// Each weight row is streamed from memory once per call and dotted with every activation row,
// which stays in cache: the kernel for batch-1 decode (GEMV, memory-bound) and for batched decode
// (a few to ~64 rows: compute-bound on wide weights). Prefill goes to sgemm (CpuForward).
//
// ISA: the binary is built for baseline x86-64; each kernel is compiled per instruction set with
// target attributes and picked at run time: scalar (any CPU), avx2 (AVX2 + FMA + F16C), avx512
// (AVX-512 F/BW/VL, whose f16 and bf16 widening needs nothing more). AVX512-BF16's dot products
// are not used: they round the activations to bf16, and the engine's arithmetic is fp32.
// TANDEM_KERNEL_ISA=scalar|avx2|avx512 forces a path (tests, benchmarks); KernelIsaFromEnv says
// why when the value is unknown or the CPU lacks it.
//
// Results: every path sums in fp32 in its own order; they differ from an exact sum by at most
// k * 2^-24 * sum_i |x_i w_i| (the fp32 summation bound), which tests/unit/linear_kernels_test.cc
// checks for each path against a double-precision reference.
//
// The functions are pure (no state): any number of threads may call them on disjoint outputs.
#pragma once

#include <string_view>

#include "common/base/status.h"
#include "common/model/weight_matrix.h"

namespace tandem {

enum class KernelIsa { kScalar, kAvx2, kAvx512 };

std::string_view KernelIsaName(KernelIsa isa);
bool CpuSupports(KernelIsa isa);
// The widest path this CPU runs.
KernelIsa BestKernelIsa();
// TANDEM_KERNEL_ISA when set and non-empty, else BestKernelIsa(). InvalidArgument naming the
// variable for an unknown value or a path this CPU cannot run.
StatusOr<KernelIsa> KernelIsaFromEnv();

// For r in [0, m) and j in [n0, n1):
//   y[r * ldy + j] = sum_i x[r * w.cols + i] * w[j, i]   (+ beta * y[r * ldy + j] when beta != 0)
// x is [m, w.cols] row major. 0 <= n0 <= n1 <= w.rows.
void LinearRows(KernelIsa isa, const float* x, int m, const WeightMatrix& w, int n0, int n1,
                float* y, int ldy, float beta);

// Widens rows [r0, r1) of w to fp32 into out ((r1 - r0) * w.cols floats), vectorised.
void WidenRows(KernelIsa isa, const WeightMatrix& w, int r0, int r1, float* out);

}  // namespace tandem
