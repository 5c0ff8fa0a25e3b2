// Status macros for the CUDA runtime, NCCL and cuBLAS. Each turns a failed
// call into an absl::Status carrying the call's text, the library's error
// string and file:line, e.g.
//   "cudaMalloc(&p, bytes) (kernels/foo.cu:42): out of memory [cudaError 2]"
// Only include from code built with the CUDA toolkit.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace symtp {

absl::Status CudaErrorToStatus(cudaError_t e, absl::string_view call, const char* file, int line);
absl::Status NcclErrorToStatus(ncclResult_t r, absl::string_view call, const char* file, int line);
absl::Status CublasErrorToStatus(cublasStatus_t s, absl::string_view call, const char* file,
                                 int line);
inline absl::Status CudaStatus(cudaError_t e, absl::string_view call, const char* file, int line) {
  return e == cudaSuccess ? absl::OkStatus() : CudaErrorToStatus(e, call, file, line);
}

}  // namespace symtp

#define CUDA_RETURN_IF_ERROR(call)                                                  \
  do {                                                                              \
    cudaError_t symtp_cuda_err_ = (call);                                           \
    if (symtp_cuda_err_ != cudaSuccess) {                                           \
      return ::symtp::CudaErrorToStatus(symtp_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

// The call's status, OK on cudaSuccess; a kernel launcher ends with
// `return CUDA_STATUS(cudaGetLastError());`.
#define CUDA_STATUS(call) ::symtp::CudaStatus((call), #call, __FILE__, __LINE__)

#define NCCL_RETURN_IF_ERROR(call)                                                  \
  do {                                                                              \
    ncclResult_t symtp_nccl_res_ = (call);                                          \
    if (symtp_nccl_res_ != ncclSuccess && symtp_nccl_res_ != ncclInProgress) {      \
      return ::symtp::NcclErrorToStatus(symtp_nccl_res_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call)                                                   \
  do {                                                                                 \
    cublasStatus_t symtp_cublas_st_ = (call);                                          \
    if (symtp_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                   \
      return ::symtp::CublasErrorToStatus(symtp_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
