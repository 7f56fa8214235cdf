// RAII owners for CUDA handles (stream, device buffer, cuBLAS handle) and the CUDA error macros.
//
// Includable from plain C++: no CUDA header is pulled in. cudaStream_t and cublasHandle_t are
// forward-declared exactly as the CUDA headers declare them, so both spellings agree.
//
// Errors: the factories and copies return Status for what can go wrong in a healthy process
// (out of device memory -> ResourceExhausted; no device or driver -> Unavailable; anything else
// -> Internal). The *_CHECK macros abort with file:line for broken invariants (a failed
// cudaFree, an invalid handle). Every owner is move-only; a moved-from owner holds nothing.
// Threads: an owner may move between threads; a stream or handle is used by one at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
struct cublasContext;
typedef struct cublasContext* cublasHandle_t;
struct CUgraphExec_st;
typedef struct CUgraphExec_st* cudaGraphExec_t;

namespace tandem::cuda {

// The Status for a non-zero cudaError_t / cublasStatus_t (both are ints underneath; 0 = OK).
Status CudaErrorStatus(int error, const char* expr, const char* file, int line);
Status CublasErrorStatus(int error, const char* expr, const char* file, int line);
[[noreturn]] void CudaCheckFailed(int error, const char* expr, const char* file, int line);
[[noreturn]] void CublasCheckFailed(int error, const char* expr, const char* file, int line);

}  // namespace tandem::cuda

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define TANDEM_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                      \
    const int tandem_cuda_err_ = static_cast<int>(expr);                                    \
    if (tandem_cuda_err_ != 0)                                                              \
      return ::tandem::cuda::CudaErrorStatus(tandem_cuda_err_, #expr, __FILE__, __LINE__);  \
  } while (0)

// Aborts with file:line and the CUDA error name when a CUDA runtime call fails.
#define TANDEM_CUDA_CHECK(expr)                                                          \
  do {                                                                                   \
    const int tandem_cuda_err_ = static_cast<int>(expr);                                 \
    if (tandem_cuda_err_ != 0) [[unlikely]]                                              \
      ::tandem::cuda::CudaCheckFailed(tandem_cuda_err_, #expr, __FILE__, __LINE__);      \
  } while (0)

#define TANDEM_CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                        \
    const int tandem_cublas_err_ = static_cast<int>(expr);                                    \
    if (tandem_cublas_err_ != 0)                                                              \
      return ::tandem::cuda::CublasErrorStatus(tandem_cublas_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define TANDEM_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                     \
    const int tandem_cublas_err_ = static_cast<int>(expr);                                 \
    if (tandem_cublas_err_ != 0) [[unlikely]]                                              \
      ::tandem::cuda::CublasCheckFailed(tandem_cublas_err_, #expr, __FILE__, __LINE__);    \
  } while (0)

namespace tandem::cuda {

// Number of visible devices; Unavailable when there is no device or no usable driver.
StatusOr<int> DeviceCount();
// Makes `device` current for the calling thread.
Status SetDevice(int device);
// Total memory of the current device, in bytes.
StatusOr<uint64_t> DeviceMemoryBytes();
// Free memory of the current device, in bytes, now (other processes' allocations taken).
StatusOr<uint64_t> DeviceFreeMemoryBytes();
// "NVIDIA H100 80GB HBM3" (the current device's name).
StatusOr<std::string> DeviceName();

// A non-blocking CUDA stream on the current device.
class CudaStream {
 public:
  static StatusOr<CudaStream> Create();
  CudaStream() = default;  // holds nothing
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  // Waits for everything queued so far; reports an error raised by earlier async work.
  Status Synchronize() const;
  // The same, giving up after `timeout` with DeadlineExceeded (the work stays queued): for a
  // stream whose work waits on other devices (a collective), polled every 20 us.
  Status SynchronizeWithin(std::chrono::milliseconds timeout) const;

 private:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_ = nullptr;
};

// Device memory of a fixed size on the current device (cudaMalloc; 256-byte aligned).
class DeviceBuffer {
 public:
  // ResourceExhausted when the device is out of memory. Zero bytes gives an empty buffer.
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

  // Copies `bytes` between host memory and this buffer at byte `offset`, ordered on `stream`
  // (nullptr: the legacy default stream). With pageable host memory the call returns once the
  // host side may be reused. Out-of-range copies are invariant violations (abort).
  Status CopyFromHost(const void* host, size_t bytes, cudaStream_t stream = nullptr,
                      size_t offset = 0);
  Status CopyToHost(void* host, size_t bytes, cudaStream_t stream = nullptr,
                    size_t offset = 0) const;
  Status Zero(cudaStream_t stream = nullptr);

 private:
  DeviceBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (cudaMallocHost): copies to and from it are truly asynchronous, and
// may be captured in a CUDA graph.
class PinnedHostBuffer {
 public:
  static StatusOr<PinnedHostBuffer> Allocate(size_t bytes);
  PinnedHostBuffer() = default;
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

 private:
  PinnedHostBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// An instantiated CUDA graph: the work one capture of a stream recorded, replayed with one
// launch. Capture: BeginCapture(stream), queue the work as usual, then EndCapture. The replay
// reads and writes the same addresses as the captured work did.
class CudaGraph {
 public:
  static Status BeginCapture(cudaStream_t stream);
  // Ends the capture begun on `stream` and instantiates what it recorded.
  static StatusOr<CudaGraph> EndCapture(cudaStream_t stream);
  CudaGraph() = default;
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  bool empty() const { return exec_ == nullptr; }
  Status Launch(cudaStream_t stream) const;

 private:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  cudaGraphExec_t exec_ = nullptr;
};

// A cuBLAS handle on the current device.
class CublasHandle {
 public:
  static StatusOr<CublasHandle> Create();
  CublasHandle() = default;
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }
  // Subsequent cuBLAS calls on this handle are queued on `stream`.
  Status SetStream(cudaStream_t stream);
  // Gives cuBLAS its own workspace (so that it allocates nothing while a graph is captured).
  Status SetWorkspace(void* workspace, size_t bytes);

 private:
  explicit CublasHandle(cublasHandle_t handle) : handle_(handle) {}
  cublasHandle_t handle_ = nullptr;
};

}  // namespace tandem::cuda
