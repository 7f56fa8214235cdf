#include "common/engine/linear_kernels.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and warn that it is (or may be)
// used uninitialized; the instructions they emit read no such operand.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace tandem {
namespace {

constexpr const char* kIsaEnv = "TANDEM_KERNEL_ISA";

template <WeightDType D>
using Elem = std::conditional_t<D == WeightDType::kF32, float, uint16_t>;

template <WeightDType D>
inline float WidenOne(const void* row, int i) {
  const Elem<D> v = static_cast<const Elem<D>*>(row)[i];
  if constexpr (D == WeightDType::kF32) {
    return v;
  } else if constexpr (D == WeightDType::kBF16) {
    return BF16ToF32(v);
  } else {
    return F16ToF32(v);
  }
}

// ---- scalar: any x86-64 ------------------------------------------------------------------------

template <WeightDType D>
void LinearScalar(const float* x, int m, const WeightMatrix& w, int n0, int n1, float* y, int ldy,
                  float beta) {
  const int k = w.cols;
  for (int j = n0; j < n1; ++j) {
    const void* row = w.row(j);
    for (int r = 0; r < m; ++r) {
      const float* xr = x + static_cast<size_t>(r) * k;
      float acc[4] = {0, 0, 0, 0};  // four partial sums: independent chains
      int i = 0;
      for (; i + 4 <= k; i += 4)
        for (int u = 0; u < 4; ++u) acc[u] += WidenOne<D>(row, i + u) * xr[i + u];
      float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      for (; i < k; ++i) s += WidenOne<D>(row, i) * xr[i];
      float* out = y + static_cast<size_t>(r) * ldy + j;
      *out = beta == 0.0f ? s : s + beta * *out;
    }
  }
}

// ---- AVX2 + FMA + F16C ---------------------------------------------------------------------------

#define TANDEM_AVX2 [[gnu::target("avx2,fma,f16c")]]

template <WeightDType D>
TANDEM_AVX2 inline __m256 Widen8(const void* row, int i) {
  const Elem<D>* p = static_cast<const Elem<D>*>(row) + i;
  if constexpr (D == WeightDType::kF32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (D == WeightDType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// The four sums of a, b, c, d in one register.
TANDEM_AVX2 inline __m128 Reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

TANDEM_AVX2 inline float Reduce1(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

inline void Store(float* y, float v, float beta) { *y = beta == 0.0f ? v : v + beta * *y; }

// Touches element i of the NR weight rows after the tile's own (see TileAvx512's Prefetch).
template <WeightDType D, int NR>
inline void PrefetchNextTile(const char* w0, size_t ws, int i) {
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j)
    _mm_prefetch(w0 + (NR + j) * ws + static_cast<size_t>(i) * sizeof(Elem<D>), _MM_HINT_T0);
}

// y[r, j] for NR weight rows from `w0` (row stride `ws` bytes) and MR activation rows from `x`.
// Prefetch: as TileAvx512's.
template <WeightDType D, int NR, int MR, bool Prefetch = false>
TANDEM_AVX2 void TileAvx2(const float* x, int k, const char* w0, size_t ws, float* y, int ldy,
                          float beta) {
  __m256 acc[NR][MR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) acc[j][r] = _mm256_setzero_ps();
  const int k8 = k / 8 * 8;
  for (int i = 0; i < k8; i += 8) {
    __m256 xv[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) xv[r] = _mm256_loadu_ps(x + static_cast<size_t>(r) * k + i);
    if constexpr (Prefetch) {
      if (i % 32 == 0) PrefetchNextTile<D, NR>(w0, ws, i);  // once per 64-byte line of bf16/f16
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = Widen8<D>(w0 + j * ws, i);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) acc[j][r] = _mm256_fmadd_ps(wv, xv[r], acc[j][r]);
    }
  }
  float sums[MR][NR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    if constexpr (NR % 4 == 0) {
#pragma GCC unroll 2
      for (int j = 0; j < NR; j += 4)
        _mm_storeu_ps(&sums[r][j], Reduce4(acc[j][r], acc[j + 1][r], acc[j + 2][r], acc[j + 3][r]));
    } else {
      for (int j = 0; j < NR; ++j) sums[r][j] = Reduce1(acc[j][r]);
    }
  }
  for (int i = k8; i < k; ++i)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        sums[r][j] += WidenOne<D>(w0 + j * ws, i) * x[static_cast<size_t>(r) * k + i];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) Store(y + static_cast<size_t>(r) * ldy + j, sums[r][j], beta);
}

// 16 ymm registers: 4 weight rows x 2 activation rows (8 accumulators), or 8 x 1 for GEMV.
template <WeightDType D>
TANDEM_AVX2 void LinearAvx2(const float* x, int m, const WeightMatrix& w, int n0, int n1, float* y,
                            int ldy, float beta) {
  const int k = w.cols;
  const size_t ws = static_cast<size_t>(k) * sizeof(Elem<D>);
  const char* base = static_cast<const char*>(w.data);
  int j = n0;
  if (m == 1)
    for (; j + 8 <= n1; j += 8)
      TileAvx2<D, 8, 1, D != WeightDType::kF32>(x, k, base + j * ws, ws, y + j, ldy, beta);
  for (; j + 4 <= n1; j += 4) {
    int r = 0;
    for (; r + 2 <= m; r += 2)
      TileAvx2<D, 4, 2>(x + static_cast<size_t>(r) * k, k, base + j * ws, ws,
                        y + static_cast<size_t>(r) * ldy + j, ldy, beta);
    for (; r < m; ++r)
      TileAvx2<D, 4, 1>(x + static_cast<size_t>(r) * k, k, base + j * ws, ws,
                        y + static_cast<size_t>(r) * ldy + j, ldy, beta);
  }
  for (; j < n1; ++j)
    for (int r = 0; r < m; ++r)
      TileAvx2<D, 1, 1>(x + static_cast<size_t>(r) * k, k, base + j * ws, ws,
                        y + static_cast<size_t>(r) * ldy + j, ldy, beta);
}

template <WeightDType D>
TANDEM_AVX2 void WidenAvx2(const void* in, size_t n, float* out) {
  const Elem<D>* p = static_cast<const Elem<D>*>(in);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Widen8<D>(p + i, 0));
  for (; i < n; ++i) out[i] = WidenOne<D>(p + i, 0);
}

// ---- AVX-512 F/BW/VL -----------------------------------------------------------------------------

#define TANDEM_AVX512 [[gnu::target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")]]

template <WeightDType D>
TANDEM_AVX512 inline __m512 Widen16(const void* row, int i) {
  const Elem<D>* p = static_cast<const Elem<D>*>(row) + i;
  if constexpr (D == WeightDType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (D == WeightDType::kBF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// The first `mask` lanes of the 16 at i, zeros elsewhere (never reads past them).
template <WeightDType D>
TANDEM_AVX512 inline __m512 Widen16Masked(const void* row, int i, __mmask16 mask) {
  const Elem<D>* p = static_cast<const Elem<D>*>(row) + i;
  if constexpr (D == WeightDType::kF32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else if constexpr (D == WeightDType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
  }
}

TANDEM_AVX512 inline __m256 Half(__m512 a) {
  // The upper 256 bits by a lane shuffle (GCC 12 warns on extractf64x4's undefined operand).
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm512_castps512_ps256(_mm512_shuffle_f32x4(a, a, 0x4e)));
}

TANDEM_AVX512 inline __m128 Reduce4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(Half(a), Half(b)), _mm256_hadd_ps(Half(c), Half(d)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Prefetch (GEMV of 2-byte weights): while the tile streams its NR rows, also touch the NR rows
// after them (the next tile's), so that their streams have started by the time the next tile
// reads them. Rows of bf16/f16 are half as long as f32's, too short for the hardware
// prefetchers to ramp up on: measured on SmolLM2 bf16 at 1 thread, decode went from 22.7 to
// 46-52 tokens/s; on f32 the same prefetch costs a third (31 -> 21), so f32 does without.
template <WeightDType D, int NR, int MR, bool Prefetch = false>
TANDEM_AVX512 void TileAvx512(const float* x, int k, const char* w0, size_t ws, float* y, int ldy,
                              float beta) {
  __m512 acc[NR][MR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) acc[j][r] = _mm512_setzero_ps();
  const int k16 = k / 16 * 16;
  for (int i = 0; i < k16; i += 16) {
    __m512 xv[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_ps(x + static_cast<size_t>(r) * k + i);
    if constexpr (Prefetch) PrefetchNextTile<D, NR>(w0, ws, i);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m512 wv = Widen16<D>(w0 + j * ws, i);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) acc[j][r] = _mm512_fmadd_ps(wv, xv[r], acc[j][r]);
    }
  }
  if (k16 < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - k16)) - 1);
    __m512 xv[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
      xv[r] = _mm512_maskz_loadu_ps(mask, x + static_cast<size_t>(r) * k + k16);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m512 wv = Widen16Masked<D>(w0 + j * ws, k16, mask);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) acc[j][r] = _mm512_fmadd_ps(wv, xv[r], acc[j][r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    float* out = y + static_cast<size_t>(r) * ldy;
    if constexpr (NR % 4 == 0) {
#pragma GCC unroll 2
      for (int j = 0; j < NR; j += 4) {
        __m128 s = Reduce4x16(acc[j][r], acc[j + 1][r], acc[j + 2][r], acc[j + 3][r]);
        if (beta != 0.0f) s = _mm_fmadd_ps(_mm_set1_ps(beta), _mm_loadu_ps(out + j), s);
        _mm_storeu_ps(out + j, s);
      }
    } else {
      for (int j = 0; j < NR; ++j) Store(out + j, _mm512_reduce_add_ps(acc[j][r]), beta);
    }
  }
}

// 32 zmm registers: 4 weight rows x 4 activation rows (16 accumulators), or 8 x 1 for GEMV.
template <WeightDType D>
TANDEM_AVX512 void LinearAvx512(const float* x, int m, const WeightMatrix& w, int n0, int n1,
                                float* y, int ldy, float beta) {
  const int k = w.cols;
  const size_t ws = static_cast<size_t>(k) * sizeof(Elem<D>);
  const char* base = static_cast<const char*>(w.data);
  int j = n0;
  if (m == 1)
    for (; j + 8 <= n1; j += 8)
      TileAvx512<D, 8, 1, D != WeightDType::kF32>(x, k, base + j * ws, ws, y + j, ldy, beta);
  for (; j + 4 <= n1; j += 4) {
    const char* wj = base + j * ws;
    int r = 0;
    for (; r + 4 <= m; r += 4)
      TileAvx512<D, 4, 4>(x + static_cast<size_t>(r) * k, k, wj, ws,
                          y + static_cast<size_t>(r) * ldy + j, ldy, beta);
    if (r + 2 <= m) {
      TileAvx512<D, 4, 2>(x + static_cast<size_t>(r) * k, k, wj, ws,
                          y + static_cast<size_t>(r) * ldy + j, ldy, beta);
      r += 2;
    }
    if (r < m)
      TileAvx512<D, 4, 1>(x + static_cast<size_t>(r) * k, k, wj, ws,
                          y + static_cast<size_t>(r) * ldy + j, ldy, beta);
  }
  for (; j < n1; ++j)
    for (int r = 0; r < m; ++r)
      TileAvx512<D, 1, 1>(x + static_cast<size_t>(r) * k, k, base + j * ws, ws,
                          y + static_cast<size_t>(r) * ldy + j, ldy, beta);
}

template <WeightDType D>
TANDEM_AVX512 void WidenAvx512(const void* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, Widen16<D>(static_cast<const Elem<D>*>(in) + i, 0));
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, mask, Widen16Masked<D>(static_cast<const Elem<D>*>(in) + i, 0, mask));
  }
}

}  // namespace

std::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar: return "scalar";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
  }
  return "scalar";
}

bool CpuSupports(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return true;
    case KernelIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case KernelIsa::kAvx512:
      return CpuSupports(KernelIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

KernelIsa BestKernelIsa() {
  if (CpuSupports(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  if (CpuSupports(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kScalar;
}

StatusOr<KernelIsa> KernelIsaFromEnv() {
  const char* value = std::getenv(kIsaEnv);
  if (value == nullptr || *value == '\0') return BestKernelIsa();
  const std::string v = value;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (v != KernelIsaName(isa)) continue;
    if (!CpuSupports(isa))
      return InvalidArgument(std::string(kIsaEnv) + "=" + v + ": this CPU cannot run the " + v +
                             " kernels (best here: " + std::string(KernelIsaName(BestKernelIsa())) +
                             ")");
    return isa;
  }
  return InvalidArgument(std::string(kIsaEnv) + "='" + v +
                         "' is not a kernel path (scalar, avx2, avx512)");
}

void LinearRows(KernelIsa isa, const float* x, int m, const WeightMatrix& w, int n0, int n1,
                float* y, int ldy, float beta) {
  if (m <= 0 || n0 >= n1) return;
  switch (isa) {
    case KernelIsa::kAvx512:
      switch (w.dtype) {
        case WeightDType::kF32: return LinearAvx512<WeightDType::kF32>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kBF16: return LinearAvx512<WeightDType::kBF16>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kF16: return LinearAvx512<WeightDType::kF16>(x, m, w, n0, n1, y, ldy, beta);
      }
      return;
    case KernelIsa::kAvx2:
      switch (w.dtype) {
        case WeightDType::kF32: return LinearAvx2<WeightDType::kF32>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kBF16: return LinearAvx2<WeightDType::kBF16>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kF16: return LinearAvx2<WeightDType::kF16>(x, m, w, n0, n1, y, ldy, beta);
      }
      return;
    case KernelIsa::kScalar:
      switch (w.dtype) {
        case WeightDType::kF32: return LinearScalar<WeightDType::kF32>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kBF16: return LinearScalar<WeightDType::kBF16>(x, m, w, n0, n1, y, ldy, beta);
        case WeightDType::kF16: return LinearScalar<WeightDType::kF16>(x, m, w, n0, n1, y, ldy, beta);
      }
      return;
  }
}

void WidenRows(KernelIsa isa, const WeightMatrix& w, int r0, int r1, float* out) {
  const size_t n = static_cast<size_t>(r1 - r0) * w.cols;
  const void* in = w.row(r0);
  if (w.dtype == WeightDType::kF32 || isa == KernelIsa::kScalar) return WeightRowsToF32(w, r0, r1, out);
  if (isa == KernelIsa::kAvx512) {
    if (w.dtype == WeightDType::kBF16) return WidenAvx512<WeightDType::kBF16>(in, n, out);
    return WidenAvx512<WeightDType::kF16>(in, n, out);
  }
  if (w.dtype == WeightDType::kBF16) return WidenAvx2<WeightDType::kBF16>(in, n, out);
  return WidenAvx2<WeightDType::kF16>(in, n, out);
}

}  // namespace tandem
