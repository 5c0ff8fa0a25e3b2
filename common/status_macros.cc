#include "common/status_macros.h"

#include <cstring>

namespace symtp {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string SourceLocation(const char* file, int line) {
  absl::string_view f(file);
  // Trim to the path below the repository root for readable messages.
  for (absl::string_view root : {"/common/", "/ipc/", "/protocol/", "/models/", "/kernels/",
                                "/scheduler/", "/worker/", "/tools/", "/tests/", "/bench/"}) {
    auto pos = f.rfind(root);
    if (pos != absl::string_view::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  return absl::StrCat(f, ":", line);
}

absl::Status ErrnoToStatus(int err, absl::string_view call, const char* file, int line) {
  absl::StatusCode code;
  switch (err) {
    case ENOENT: code = absl::StatusCode::kNotFound; break;
    case EEXIST: code = absl::StatusCode::kAlreadyExists; break;
    case EACCES:
    case EPERM: code = absl::StatusCode::kPermissionDenied; break;
    case EINVAL: code = absl::StatusCode::kInvalidArgument; break;
    case ENOMEM:
    case ENOSPC: code = absl::StatusCode::kResourceExhausted; break;
    case ETIMEDOUT: code = absl::StatusCode::kDeadlineExceeded; break;
    case EAGAIN:
    case EINTR: code = absl::StatusCode::kUnavailable; break;
    case ESRCH:
    case EPIPE: code = absl::StatusCode::kUnavailable; break;
    default: code = absl::StatusCode::kInternal; break;
  }
  char buf[256];
  const char* msg = strerror_r(err, buf, sizeof(buf));  // GNU variant
  return absl::Status(code, absl::StrCat(call, " (", SourceLocation(file, line), "): ", msg,
                                         " [errno ", err, "]"));
}

}  // namespace symtp
