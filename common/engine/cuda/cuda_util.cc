#include "common/engine/cuda/cuda_util.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

namespace tandem::cuda {
namespace {

std::string Describe(const char* what, const char* name, const char* expr, const char* file,
                     int line) {
  return std::string(what) + " " + name + " in " + expr + " at " + file + ":" +
         std::to_string(line);
}

}  // namespace

Status CudaErrorStatus(int error, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(error);
  std::string message = Describe("CUDA error", cudaGetErrorName(err), expr, file, line) + ": " +
                        cudaGetErrorString(err);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      return Unavailable(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

Status CublasErrorStatus(int error, const char* expr, const char* file, int line) {
  const auto err = static_cast<cublasStatus_t>(error);
  std::string message = Describe("cuBLAS error", cublasGetStatusName(err), expr, file, line);
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhausted(std::move(message));
  if (err == CUBLAS_STATUS_NOT_INITIALIZED) return Unavailable(std::move(message));
  return Internal(std::move(message));
}

void CudaCheckFailed(int error, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(error);
  std::fprintf(stderr, "%s:%d: CUDA check failed: %s: %s (%s)\n", file, line, expr,
               cudaGetErrorName(err), cudaGetErrorString(err));
  std::abort();
}

void CublasCheckFailed(int error, const char* expr, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: cuBLAS check failed: %s: %s\n", file, line, expr,
               cublasGetStatusName(static_cast<cublasStatus_t>(error)));
  std::abort();
}

StatusOr<int> DeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string where = visible != nullptr
                                ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")"
                                : std::string();
  // No driver, no device, or none visible: the machine has no GPU for us, not a bug.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || count == 0) {
    (void)cudaGetLastError();
    return Unavailable(std::string("no usable CUDA device") + where + ": " +
                       (err == cudaSuccess                   ? "none visible"
                        : err == cudaErrorInsufficientDriver ? "no NVIDIA driver, or one older than this "
                                                               "CUDA runtime"
                                                             : cudaGetErrorString(err)));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(err);
  return count;
}

Status SetDevice(int device) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return Status::Ok();
}

StatusOr<uint64_t> DeviceMemoryBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return uint64_t{total_bytes};
}

StatusOr<uint64_t> DeviceFreeMemoryBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return uint64_t{free_bytes};
}

StatusOr<std::string> DeviceName() {
  int device = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name);
}

// ---- PinnedHostBuffer ------------------------------------------------------------------------

StatusOr<PinnedHostBuffer> PinnedHostBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return PinnedHostBuffer();
  void* data = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, bytes));
  return PinnedHostBuffer(data, bytes);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) TANDEM_CUDA_CHECK(cudaFreeHost(data_));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) TANDEM_CUDA_CHECK(cudaFreeHost(data_));
}

// ---- CudaGraph ---------------------------------------------------------------------------------

Status CudaGraph::BeginCapture(cudaStream_t stream) {
  // Relaxed: other threads' CUDA calls (a transport's copies) do not break the capture.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  return Status::Ok();
}

StatusOr<CudaGraph> CudaGraph::EndCapture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
  TANDEM_CUDA_RETURN_IF_ERROR(err);
  return CudaGraph(exec);
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec_));
}

Status CudaGraph::Launch(cudaStream_t stream) const {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return Status::Ok();
}

// ---- CudaStream ----------------------------------------------------------------------------

StatusOr<CudaStream> CudaStream::Create() {
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return CudaStream(stream);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) TANDEM_CUDA_CHECK(cudaStreamDestroy(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) TANDEM_CUDA_CHECK(cudaStreamDestroy(stream_));
}

Status CudaStream::Synchronize() const {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaStream::SynchronizeWithin(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return Status::Ok();
    if (state != cudaErrorNotReady)
      TANDEM_CUDA_RETURN_IF_ERROR(state);
    if (std::chrono::steady_clock::now() >= deadline)
      return DeadlineExceeded("the GPU stream did not finish within " +
                              std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// ---- DeviceBuffer --------------------------------------------------------------------------

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  void* data = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, bytes));
  return DeviceBuffer(data, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) TANDEM_CUDA_CHECK(cudaFree(data_));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) TANDEM_CUDA_CHECK(cudaFree(data_));
}

Status DeviceBuffer::CopyFromHost(const void* host, size_t bytes, cudaStream_t stream,
                                  size_t offset) {
  TANDEM_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "copy past the buffer's end");
  if (bytes == 0) return Status::Ok();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(data_) + offset, host, bytes,
                                              cudaMemcpyHostToDevice, stream));
  return Status::Ok();
}

Status DeviceBuffer::CopyToHost(void* host, size_t bytes, cudaStream_t stream,
                                size_t offset) const {
  TANDEM_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "copy past the buffer's end");
  if (bytes == 0) return Status::Ok();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, static_cast<const char*>(data_) + offset,
                                              bytes, cudaMemcpyDeviceToHost, stream));
  // Device-to-host into pageable memory may return before the data lands: wait for it.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status DeviceBuffer::Zero(cudaStream_t stream) {
  if (bytes_ == 0) return Status::Ok();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data_, 0, bytes_, stream));
  return Status::Ok();
}

// ---- CublasHandle --------------------------------------------------------------------------

StatusOr<CublasHandle> CublasHandle::Create() {
  cublasHandle_t handle = nullptr;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  return CublasHandle(handle);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) TANDEM_CUBLAS_CHECK(cublasDestroy(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) TANDEM_CUBLAS_CHECK(cublasDestroy(handle_));
}

Status CublasHandle::SetStream(cudaStream_t stream) {
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream));
  return Status::Ok();
}

Status CublasHandle::SetWorkspace(void* workspace, size_t bytes) {
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(handle_, workspace, bytes));
  return Status::Ok();
}

}  // namespace tandem::cuda
