#include "common/engine/cuda/cuda_util.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
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
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return Unavailable("no CUDA device is visible");
  return count;
}

Status SetDevice(int device) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
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

}  // namespace tandem::cuda
