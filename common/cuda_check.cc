#include "common/cuda_check.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace symtp {

absl::Status CudaErrorToStatus(cudaError_t e, absl::string_view call, const char* file, int line) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (e) {
    case cudaErrorMemoryAllocation: code = absl::StatusCode::kResourceExhausted; break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer: code = absl::StatusCode::kInvalidArgument; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorPeerAccessUnsupported: code = absl::StatusCode::kUnavailable; break;
    case cudaErrorNotReady: code = absl::StatusCode::kUnavailable; break;
    default: break;
  }
  return absl::Status(code, absl::StrCat(call, " (", SourceLocation(file, line),
                                         "): ", cudaGetErrorString(e), " [",
                                         cudaGetErrorName(e), "]"));
}

absl::Status NcclErrorToStatus(ncclResult_t r, absl::string_view call, const char* file, int line) {
  absl::StatusCode code = r == ncclInvalidArgument || r == ncclInvalidUsage
                              ? absl::StatusCode::kInvalidArgument
                          : r == ncclRemoteError || r == ncclSystemError
                              ? absl::StatusCode::kUnavailable
                              : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, " (", SourceLocation(file, line),
                                         "): ", ncclGetErrorString(r), " [ncclResult ",
                                         static_cast<int>(r), "]"));
}

absl::Status CublasErrorToStatus(cublasStatus_t s, absl::string_view call, const char* file,
                                 int line) {
  absl::StatusCode code = s == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                          : s == CUBLAS_STATUS_INVALID_VALUE ? absl::StatusCode::kInvalidArgument
                          : s == CUBLAS_STATUS_NOT_SUPPORTED ? absl::StatusCode::kUnimplemented
                                                             : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, " (", SourceLocation(file, line),
                                         "): ", cublasGetStatusString(s), " [cublasStatus ",
                                         static_cast<int>(s), "]"));
}

}  // namespace symtp
