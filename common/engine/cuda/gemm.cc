// Gemm() of common/engine/cuda/kernels.h: the cuBLAS side, kept out of the .cu so it builds with the
// host compiler.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/engine/cuda/kernels.h"

namespace tandem::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) { return dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

}  // namespace

Status Gemm(const CublasHandle& handle, DType in_dtype, const void* x, const void* w,
            DType out_dtype, void* y, int32_t m, int32_t n, int32_t k, float beta) {
  TANDEM_CHECK(handle.get() != nullptr, "Gemm on an empty CublasHandle");
  TANDEM_CHECK(m >= 0 && n >= 0 && k > 0, "bad Gemm shape");
  if (m == 0 || n == 0) return Status::Ok();
  const float alpha = 1.0f;
  // cuBLAS is column-major: row-major y[m][n] is column-major y^T (n x m) = w (n x k, stored
  // as column-major w^T, hence OP_T) times x^T (k x m, stored as column-major x^T, OP_N).
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k,
                                             &alpha, w, CudaType(in_dtype), k, x,
                                             CudaType(in_dtype), k, &beta, y,
                                             CudaType(out_dtype), n, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

}  // namespace tandem::cuda
