#include "common/status_macros.h"

#include <cstring>

#include "absl/strings/match.h"

namespace symtp {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string SourceLocation(const char* file, int line) {
  absl::string_view f(file);
  // Paths relative to the source root (compiled in by common/CMakeLists.txt)
  // for readable messages; failing that, the path below a top-level folder.
#ifdef SYMTP_SOURCE_DIR
  constexpr absl::string_view kSourceDir = SYMTP_SOURCE_DIR "/";
  if (absl::StartsWith(f, kSourceDir)) return absl::StrCat(f.substr(kSourceDir.size()), ":", line);
#endif
  for (absl::string_view root : {"/common/", "/ipc/", "/protocol/", "/models/", "/kernels/",
                                "/scheduler/", "/worker/", "/runtime/", "/tools/", "/tests/",
                                "/bench/"}) {
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
