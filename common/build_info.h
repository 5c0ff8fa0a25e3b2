// What this binary was built from: the git commit of the source tree (with
// "-dirty" when tracked files had changed), the CMake build type, and the CUDA
// toolkit and NCCL versions it was compiled against ("none" in a build without
// the CUDA backend). `symtp --version` prints them; summary.json records them.
// The commit is read at every build (cmake/BuildInfo.cmake), not only at
// configure time.
#pragma once

#include <string>

namespace symtp {

const char* BuildCommit();     // e.g. "6fe628f1a2b3" or "6fe628f1a2b3-dirty"; "unknown" outside git
const char* BuildType();       // e.g. "RelWithDebInfo"
const char* BuildCudaVersion();  // e.g. "13.0.88", or "none"
const char* BuildNcclVersion();  // e.g. "2.28.3", or "none"
const char* BuildCudaArch();     // CMAKE_CUDA_ARCHITECTURES, e.g. "90", or "none"
const char* BuildVersion();    // the project version, e.g. "0.1.0"

// "symtp 0.1.0 (commit ..., RelWithDebInfo, CUDA ..., NCCL ...)" and a line per field.
std::string VersionText();

}  // namespace symtp
