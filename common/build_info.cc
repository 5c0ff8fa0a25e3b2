#include "common/build_info.h"

#include "absl/strings/str_cat.h"
#include "symtp_build_info_generated.h"

namespace symtp {

const char* BuildCommit() { return SYMTP_GIT_COMMIT; }
const char* BuildType() { return SYMTP_BUILD_TYPE; }
const char* BuildCudaVersion() { return SYMTP_CUDA_VERSION; }
const char* BuildNcclVersion() { return SYMTP_NCCL_VERSION; }
const char* BuildCudaArch() { return SYMTP_CUDA_ARCH; }
const char* BuildVersion() { return SYMTP_PROJECT_VERSION; }

std::string VersionText() {
  return absl::StrCat("symtp ", BuildVersion(), "\ncommit: ", BuildCommit(),
                      "\nbuild type: ", BuildType(), "\nCUDA: ", BuildCudaVersion(),
                      "\nCUDA architectures: ", BuildCudaArch(), "\nNCCL: ", BuildNcclVersion(),
                      "\n");
}

}  // namespace symtp
