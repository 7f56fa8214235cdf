// A CUDA emulator for Tandem's CUDA code, so that the GPU checks (every kernel against its CPU
// reference; the CUDA forward pass, graphs included, against the CPU backend) run on machines
// without a GPU (CI). It emulates the CUDA execution model, not a GPU: what the code computes,
// not how fast, and not the GPU's memory model.
//
// A kernel's .cu file is compiled as C++ (tests/cuda_emu/rewrite_launches.py turns each
// `kernel<<<grid, block, shared, stream>>>(args)` into cuda_emu::Launch(...)). A launch runs
// its thread blocks one after another on the calling thread; each block's threads are fibers
// (boost.context) that run until a __syncthreads or a warp operation, where they wait for every
// live thread of the block or warp, as on the GPU. A barrier that some live threads never reach (a
// __syncthreads in divergent code) is a deadlock the emulator reports and aborts on, where a GPU
// would hang or go wrong. __shared__ variables are per block (function statics, re-used by the
// next block, as uninitialised as on the GPU); atomics are plain operations (one thread runs at
// a time). Warp operations take the full mask only (the code's only use).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __grid_constant__
#define __shared__ static
#define __launch_bounds__(...)

struct uint4 {
  unsigned x, y, z, w;
} __attribute__((aligned(16)));
struct int4 {
  int x, y, z, w;
} __attribute__((aligned(16)));
struct float4 {
  float x, y, z, w;
} __attribute__((aligned(16)));
struct uint2 {
  unsigned x, y;
} __attribute__((aligned(8)));
struct float2 {
  float x, y;
} __attribute__((aligned(8)));

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

namespace cuda_emu {

// The running thread's coordinates (the fiber's).
struct ThreadCoordinates {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
};
const ThreadCoordinates& Current();

void SyncThreads();
// Every live lane of the calling thread's warp posts `value`; returns all the warp's posts
// (by lane; 32 entries, dead lanes' unset) once every live lane has posted.
const uint64_t* WarpExchange(uint64_t value, unsigned* live_lanes);

// Runs `body` as a kernel of `grid` x `block` threads (cudaGetLastError reports a bad shape),
// or records it while a stream is captured.
void LaunchBody(dim3 grid, dim3 block, std::function<void()> body);
// Runs `work` now, or records it while a stream is captured (copies, sets, GEMMs).
void Enqueue(std::function<void()> work);
bool Capturing();

// `kernel<<<grid, block, shared, stream>>>(args...)`, as rewrite_launches.py writes it (always
// with all four: it fills in 0 and the default stream).
template <typename Kernel, typename... Args>
void Launch(dim3 grid, dim3 block, size_t /*shared*/, cudaStream_t /*stream*/, Kernel kernel,
            Args... args) {
  LaunchBody(grid, block, [=]() { kernel(args...); });
}

template <typename T>
uint64_t Bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
int Lane();

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::Current().thread_idx)
#define blockIdx (::cuda_emu::Current().block_idx)
#define blockDim (::cuda_emu::Current().block_dim)
#define gridDim (::cuda_emu::Current().grid_dim)
#define warpSize 32

inline void __syncthreads() { ::cuda_emu::SyncThreads(); }

template <typename T>
T __shfl_xor_sync(unsigned /*mask*/, T value, int lane_mask, int width = 32) {
  unsigned live = 0;
  const uint64_t* posts = ::cuda_emu::WarpExchange(::cuda_emu::Bits(value), &live);
  const int lane = ::cuda_emu::Lane();
  int from = lane ^ lane_mask;
  if ((from & ~(width - 1)) != (lane & ~(width - 1))) from = lane;  // outside its segment
  return ::cuda_emu::FromBits<T>(posts[from]);
}

template <typename T>
T __shfl_sync(unsigned /*mask*/, T value, int src_lane, int width = 32) {
  unsigned live = 0;
  const uint64_t* posts = ::cuda_emu::WarpExchange(::cuda_emu::Bits(value), &live);
  const int lane = ::cuda_emu::Lane();
  const int from = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return ::cuda_emu::FromBits<T>(posts[from]);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  unsigned live = 0;
  const uint64_t* posts = ::cuda_emu::WarpExchange(predicate != 0, &live);
  unsigned out = 0;
  for (int l = 0; l < 32; ++l)
    if ((live & mask & (1u << l)) && posts[l] != 0) out |= 1u << l;
  return out;
}

template <typename T>
unsigned __match_any_sync(unsigned mask, T value) {
  unsigned live = 0;
  const uint64_t* posts = ::cuda_emu::WarpExchange(::cuda_emu::Bits(value), &live);
  const uint64_t mine = ::cuda_emu::Bits(value);
  unsigned out = 0;
  for (int l = 0; l < 32; ++l)
    if ((live & mask & (1u << l)) && posts[l] == mine) out |= 1u << l;
  return out;
}

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// Rounded arithmetic: the emulator's sources are compiled with -ffp-contract=off, so these are
// the correctly rounded operations they name.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int_as_float(int x) { return ::cuda_emu::FromBits<float>(static_cast<uint32_t>(x)); }
inline int __float_as_int(float x) { return static_cast<int>(::cuda_emu::Bits(x)); }

template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T atomicOr(T* address, T value) {
  const T old = *address;
  *address = old | value;
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  const T old = *address;
  if (value < old) *address = value;
  return old;
}

// CUDA's device-side min/max take mixed integer types.
template <typename A, typename B>
auto min(A a, B b) -> std::common_type_t<A, B> {
  return b < a ? b : a;
}
template <typename A, typename B>
auto max(A a, B b) -> std::common_type_t<A, B> {
  return a < b ? b : a;
}
// expf, fmaxf, sqrtf, ...: the C library's (<cmath>).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
