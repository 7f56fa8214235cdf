// The CUDA emulator's runtime (tests/cuda_emu/include/cuda_emu.h): thread blocks as fibers
// (boost.context: a switch costs nanoseconds, where ucontext's makes a system call), the
// runtime API over host memory, and cuBLAS's GEMM on the host.
#include <sys/mman.h>

#include <boost/context/fiber.hpp>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_emu.h"
#include "nccl.h"

namespace cuda_emu {
namespace {

namespace ctx = boost::context;

constexpr size_t kStackBytes = size_t{256} << 10;
constexpr unsigned kMaxThreadsPerBlock = 1024;

// Fiber stacks, kept for the next block (a launch runs thousands of blocks of 256 threads).
class StackPool {
 public:
  ctx::stack_context allocate() {
    void* base = nullptr;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = ::mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                    -1, 0);
      if (base == MAP_FAILED) {
        std::fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
        std::abort();
      }
    }
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + kStackBytes;  // stacks grow down
    return sc;
  }
  void deallocate(ctx::stack_context& sc) {
    free_.push_back(static_cast<char*>(sc.sp) - kStackBytes);
  }

 private:
  std::vector<void*> free_;
};

// The allocator boost.context copies into each fiber: a handle on the pool.
struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& sc) { pool->deallocate(sc); }
};

StackPool& Stacks() {
  static thread_local StackPool pool;
  return pool;
}

struct Fiber {
  ctx::fiber self;  // resumed by the scheduler
  ctx::fiber sink;  // inside the fiber: the scheduler, to yield to
  ThreadCoordinates at;
  bool done = false;
};

// The block being run: its fibers and their barriers.
struct Block {
  std::vector<Fiber> fibers;
  const std::function<void()>* body = nullptr;
  size_t current = 0;
  size_t live = 0;
  uint64_t progress = 0;  // arrivals, releases and exits: a round without any is a deadlock
  // __syncthreads
  size_t block_arrived = 0;
  uint64_t block_generation = 0;
  // Warp exchanges, per warp.
  std::vector<size_t> warp_live, warp_arrived;
  std::vector<unsigned> warp_live_mask;  // by lane
  std::vector<uint64_t> warp_generation;
  std::vector<uint64_t> posts;     // by thread
  std::vector<uint64_t> snapshot;  // by thread: the posts of the warp's last completed exchange
};

thread_local Block* g_block = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local int g_device = 0;
// Between cudaStreamBeginCapture and cudaStreamEndCapture: the work recorded so far (kernels,
// copies, sets, GEMMs, in order), which cudaGraphLaunch replays. One capture at a time.
thread_local std::vector<std::function<void()>>* g_capture = nullptr;

void Yield() {
  Fiber& me = g_block->fibers[g_block->current];
  me.sink = std::move(me.sink).resume();
}

void CompleteWarpExchange(Block& b, size_t warp) {
  for (size_t t = warp * 32; t < std::min(b.fibers.size(), warp * 32 + 32); ++t)
    b.snapshot[t] = b.posts[t];
  b.warp_arrived[warp] = 0;
  ++b.warp_generation[warp];
}

// A thread's end: it no longer counts at barriers, which may now be complete without it.
void Exit(Block& b) {
  b.fibers[b.current].done = true;
  --b.live;
  ++b.progress;
  const size_t warp = b.current / 32;
  --b.warp_live[warp];
  b.warp_live_mask[warp] &= ~(1u << (b.current % 32));
  if (b.block_arrived > 0 && b.block_arrived == b.live) {
    b.block_arrived = 0;
    ++b.block_generation;
  }
  if (b.warp_arrived[warp] > 0 && b.warp_arrived[warp] == b.warp_live[warp])
    CompleteWarpExchange(b, warp);
}

void RunBlock(const dim3& grid, const dim3& block_dim, const dim3& block_idx,
              const std::function<void()>& body) {
  const size_t threads = size_t{block_dim.x} * block_dim.y * block_dim.z;
  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  b.live = threads;
  const size_t warps = (threads + 31) / 32;
  b.warp_live.assign(warps, 0);
  b.warp_arrived.assign(warps, 0);
  b.warp_live_mask.assign(warps, 0);
  b.warp_generation.assign(warps, 0);
  b.posts.assign(threads, 0);
  b.snapshot.assign(threads, 0);
  for (size_t t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    f.at.thread_idx = dim3(static_cast<unsigned>(t % block_dim.x),
                           static_cast<unsigned>(t / block_dim.x % block_dim.y),
                           static_cast<unsigned>(t / (size_t{block_dim.x} * block_dim.y)));
    f.at.block_idx = block_idx;
    f.at.block_dim = block_dim;
    f.at.grid_dim = grid;
    f.self = ctx::fiber(std::allocator_arg, PooledStack{&Stacks()},
                        [&b, t](ctx::fiber&& scheduler) {
                          b.fibers[t].sink = std::move(scheduler);
                          (*b.body)();
                          Exit(b);
                          return std::move(b.fibers[t].sink);
                        });
    ++b.warp_live[t / 32];
    b.warp_live_mask[t / 32] |= 1u << (t % 32);
  }
  Block* outer = g_block;
  g_block = &b;
  while (b.live > 0) {
    const uint64_t before = b.progress;
    for (size_t t = 0; t < threads; ++t) {
      if (b.fibers[t].done) continue;
      b.current = t;
      b.fibers[t].self = std::move(b.fibers[t].self).resume();
    }
    if (b.live > 0 && b.progress == before) {
      std::fprintf(stderr,
                   "cuda_emu: deadlock in block (%u,%u,%u): %zu live threads wait at barriers "
                   "that the others never reach (a __syncthreads or warp operation in "
                   "divergent code)\n",
                   block_idx.x, block_idx.y, block_idx.z, b.live);
      std::abort();
    }
  }
  g_block = outer;
}

}  // namespace

const ThreadCoordinates& Current() {
  if (g_block == nullptr) {
    std::fprintf(stderr, "cuda_emu: threadIdx outside a kernel\n");
    std::abort();
  }
  return g_block->fibers[g_block->current].at;
}

int Lane() { return static_cast<int>(g_block->current % 32); }

void SyncThreads() {
  Block& b = *g_block;
  const uint64_t generation = b.block_generation;
  ++b.progress;
  if (++b.block_arrived == b.live) {
    b.block_arrived = 0;
    ++b.block_generation;
    return;
  }
  while (b.block_generation == generation) Yield();
}

const uint64_t* WarpExchange(uint64_t value, unsigned* live_lanes) {
  Block& b = *g_block;
  const size_t warp = b.current / 32;
  b.posts[b.current] = value;
  const uint64_t generation = b.warp_generation[warp];
  ++b.progress;
  if (++b.warp_arrived[warp] == b.warp_live[warp]) {
    CompleteWarpExchange(b, warp);
  } else {
    while (b.warp_generation[warp] == generation) Yield();
  }
  *live_lanes = b.warp_live_mask[warp];
  // The snapshot stays until this warp's next exchange completes, which needs this thread.
  return b.snapshot.data() + warp * 32;
}

void Enqueue(std::function<void()> work) {
  if (g_capture != nullptr)
    g_capture->push_back(std::move(work));
  else
    work();
}

bool Capturing() { return g_capture != nullptr; }

void LaunchBody(dim3 grid, dim3 block, std::function<void()> body) {
  const size_t threads = size_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    g_last_error = cudaErrorInvalidValue;
    return;
  }
  Enqueue([grid, block, body = std::move(body)] {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) RunBlock(grid, block, dim3(x, y, z), body);
  });
}

}  // namespace cuda_emu

// ---- the runtime API ---------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    default: return "cudaError(emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }

cudaError_t cudaGetLastError() {
  const cudaError_t e = cuda_emu::g_last_error;
  cuda_emu::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return cuda_emu::g_last_error; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  cuda_emu::g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = cuda_emu::g_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulator (tests/cuda_emu, on the CPU)");
  prop->totalGlobalMem = size_t{16} << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = size_t{16} << 30;
  *total_bytes = size_t{16} << 30;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*ptr, 0xa5, bytes);  // not zero: cudaMalloc promises nothing
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
cudaError_t cudaFreeHost(void* ptr) { return cudaFree(ptr); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (cuda_emu::Capturing()) return cudaErrorStreamCaptureUnsupported;  // synchronous
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  if (bytes > 0) cuda_emu::Enqueue([=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (cuda_emu::Capturing()) return cudaErrorStreamCaptureUnsupported;
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  cuda_emu::Enqueue([=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

struct CUstream_st {};
struct CUevent_st {
  std::chrono::steady_clock::time_point recorded;
};
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cuda_emu::Capturing() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->recorded - start->recorded).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->recorded = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (cuda_emu::g_capture != nullptr) return cudaErrorStreamCaptureUnsupported;
  cuda_emu::g_capture = new std::vector<std::function<void()>>();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (cuda_emu::g_capture == nullptr) return cudaErrorInvalidValue;
  *graph = new CUgraph_st{std::move(*cuda_emu::g_capture)};
  delete cuda_emu::g_capture;
  cuda_emu::g_capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  for (const std::function<void()>& work : exec->work) cuda_emu::Enqueue(work);
  return cudaSuccess;
}

// ---- NCCL: one device, so no communicator (nccl.h) ------------------------------------------

ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) { return ncclInvalidUsage; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommRevoke(ncclComm_t, int) { return ncclInvalidUsage; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not emulated (one device)"; }

// ---- cuBLAS ------------------------------------------------------------------------------------

struct cublasContext {};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated)";
}
const char* cublasGetStatusString(cublasStatus_t status) { return cublasGetStatusName(status); }

namespace {

float LoadAs(cudaDataType_t type, const void* p, size_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// C = alpha op(A) op(B) + beta C, column-major: op(A) m x k, op(B) k x n, C m x n; the sums in
// fp32 (CUBLAS_COMPUTE_32F).
void HostGemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
              float alpha, const void* a, cudaDataType_t a_type, int lda, const void* b,
              cudaDataType_t b_type, int ldb, float beta, void* c, cudaDataType_t c_type,
              int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int p = 0; p < k; ++p) {
        const size_t ai = transa == CUBLAS_OP_N ? size_t(i) + size_t(p) * lda
                                                : size_t(p) + size_t(i) * lda;
        const size_t bi = transb == CUBLAS_OP_N ? size_t(p) + size_t(j) * ldb
                                                : size_t(j) + size_t(p) * ldb;
        sum += LoadAs(a_type, a, ai) * LoadAs(b_type, b, bi);
      }
      const size_t ci = size_t(i) + size_t(j) * ldc;
      float out = alpha * sum;
      if (beta != 0.0f) out += beta * LoadAs(c_type, c, ci);
      if (c_type == CUDA_R_32F)
        static_cast<float*>(c)[ci] = out;
      else
        static_cast<__nv_bfloat16*>(c)[ci] = __float2bfloat16_rn(out);
    }
  }
}

}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType_t a_type, int lda, const void* b,
                            cudaDataType_t b_type, int ldb, const void* beta, void* c,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (transa == CUBLAS_OP_N ? m : k) || ldb < (transb == CUBLAS_OP_N ? k : n) || ldc < m)
    return CUBLAS_STATUS_INVALID_VALUE;
  // alpha and beta are read now (they may live on the caller's stack), the matrices when the
  // work runs (at once, or when a captured graph replays it).
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  cuda_emu::Enqueue([=] {
    HostGemm(transa, transb, m, n, k, al, a, a_type, lda, b, b_type, ldb, be, c, c_type, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}
