// What the GPU checks of cuda_kernels_check share (its .cc files): the PASS/FAIL report, the
// seeded random inputs, uploads and downloads on the checks' stream, host bf16 rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/engine/cuda/cuda_util.h"
#include "common/engine/cuda/kernels.h"
#include "tests/gpu/emulated.h"

namespace tandem::cuda {

inline int g_failures = 0;
// The stream every kernel and copy of the checks is queued on (a non-blocking stream is not
// ordered with the legacy default stream: copies must go on the same one).
inline cudaStream_t g_stream = nullptr;

inline void Report(const std::string& name, double max_err, double tol) {
  const bool ok = max_err <= tol && !std::isnan(max_err);
  if (!ok) ++g_failures;
  std::printf("%-48s max_err %-12.3g tol %-10.3g %s\n", name.c_str(), max_err, tol,
              ok ? "PASS" : "FAIL");
}

template <typename T>
T Must(StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

inline void Must(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// ---- host bf16 (round to nearest even, as __float2bfloat16_rn) ----------------------------

inline uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
inline float FromBf16(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToBf16(v[i]);
  return out;
}
inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromBf16(v[i]);
  return out;
}
inline std::vector<float> RoundBf16(const std::vector<float>& v) { return FromBf16(ToBf16(v)); }

// ---- device helpers ------------------------------------------------------------------------

inline std::mt19937 g_rng(20240601);

inline std::vector<float> Random(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(g_rng);
  return v;
}

template <typename T>
inline DeviceBuffer Upload(const std::vector<T>& host) {
  DeviceBuffer buf = Must(DeviceBuffer::Allocate(host.size() * sizeof(T)), "cudaMalloc");
  Must(buf.CopyFromHost(host.data(), host.size() * sizeof(T), g_stream), "copy to device");
  return buf;
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& buf, size_t n) {
  std::vector<T> host(n);
  Must(buf.CopyToHost(host.data(), n * sizeof(T), g_stream), "copy to host");
  return host;
}

// Uploads v as dtype (f32, or bf16 bits).
inline DeviceBuffer UploadAs(DType dtype, const std::vector<float>& v) {
  return dtype == DType::kF32 ? Upload(v) : Upload(ToBf16(v));
}
inline std::vector<float> DownloadAs(DType dtype, const DeviceBuffer& buf, size_t n) {
  return dtype == DType::kF32 ? Download<float>(buf, n) : FromBf16(Download<uint16_t>(buf, n));
}
inline DeviceBuffer Scratch(size_t bytes) {
  return Must(DeviceBuffer::Allocate(bytes), "cudaMalloc");
}

// The largest |a - b|; NaN if any entry is NaN (std::max would drop it, and a kernel that
// writes NaN would pass).
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

inline const char* Name(DType d) { return d == DType::kF32 ? "f32" : "bf16"; }

// The median time of 5 runs of `body` (after one to warm up), in seconds, by events on `s`.
inline double MedianSeconds(cudaStream_t s, const std::function<void()>& body) {
  cudaEvent_t start, stop;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  body();
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    TANDEM_CUDA_CHECK(cudaEventRecord(start, s));
    body();
    TANDEM_CUDA_CHECK(cudaEventRecord(stop, s));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(start));
  TANDEM_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[2] / 1e3;
}

// The checks of the other files (each prints its rows through Report).
void CheckStridedCopies(cudaStream_t s);  // kv_copies_check.cc
void CheckRowCopies(cudaStream_t s);      // kv_copies_check.cc
void TimeStridedCopies(cudaStream_t s);   // kv_copies_check.cc
void CheckDrawRows(cudaStream_t s);       // draw_rows_check.cc
void TimeDrawRows(cudaStream_t s);        // draw_rows_check.cc
void CheckScoreEdits(cudaStream_t s);     // draw_rows_check.cc

}  // namespace tandem::cuda
