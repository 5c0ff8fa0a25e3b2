// Status plumbing for symtp. Errors are values: every fallible function returns
// absl::Status or absl::StatusOr<T>, and these macros propagate them.
//
//   SYMTP_RETURN_IF_ERROR(expr)            return the status if !ok()
//   SYMTP_RETURN_IF_ERROR_CTX(expr, ctx)   same, with "ctx: " prepended
//   SYMTP_ASSIGN_OR_RETURN(lhs, expr)      unwrap a StatusOr or return it
//   ERRNO_RETURN_IF_ERROR(call)            for POSIX calls that return -1 and set errno
//
// CUDA, NCCL and cuBLAS have their own macros in common/cuda_check.h.
#pragma once

#include <cerrno>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace symtp {

// Returns `status` with `context` prepended to its message (code unchanged).
// OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Maps an errno value to the closest absl code, with "call (file:line): strerror".
absl::Status ErrnoToStatus(int err, absl::string_view call, const char* file, int line);

// Human-readable "file:line" for error messages.
std::string SourceLocation(const char* file, int line);

}  // namespace symtp

#define SYMTP_STATUS_CONCAT_INNER_(a, b) a##b
#define SYMTP_STATUS_CONCAT_(a, b) SYMTP_STATUS_CONCAT_INNER_(a, b)

#define SYMTP_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::absl::Status symtp_status_ = (expr);          \
    if (!symtp_status_.ok()) return symtp_status_;  \
  } while (0)

#define SYMTP_RETURN_IF_ERROR_CTX(expr, ctx)                                  \
  do {                                                                        \
    ::absl::Status symtp_status_ = (expr);                                    \
    if (!symtp_status_.ok()) return ::symtp::Annotate(symtp_status_, (ctx));  \
  } while (0)

#define SYMTP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)

#define SYMTP_ASSIGN_OR_RETURN(lhs, expr) \
  SYMTP_ASSIGN_OR_RETURN_IMPL_(SYMTP_STATUS_CONCAT_(symtp_statusor_, __LINE__), lhs, expr)

#define ERRNO_RETURN_IF_ERROR(call)                                          \
  do {                                                                       \
    if ((call) == -1) {                                                      \
      return ::symtp::ErrnoToStatus(errno, #call, __FILE__, __LINE__);       \
    }                                                                        \
  } while (0)
