# Writes the build-info header (common/build_info.cc includes it) with the
# source tree's git commit. Run at every build by the symtp_build_info target
# (common/CMakeLists.txt); configure_file rewrites the header only when its
# content changes, so a new commit recompiles one file.
#   -DSRC=<source dir> -DOUT=<header> -DBUILD_TYPE=... -DCUDA_VERSION=... -DNCCL_VERSION=...
#   -DCUDA_ARCH=... (comma-separated CMAKE_CUDA_ARCHITECTURES, or none)
set(SYMTP_GIT_COMMIT "unknown")
find_program(GIT_EXECUTABLE git)
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE _commit RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET)
  if(_rc EQUAL 0 AND _commit)
    set(SYMTP_GIT_COMMIT "${_commit}")
    # Tracked files changed since the commit: say so.
    execute_process(COMMAND ${GIT_EXECUTABLE} diff --quiet HEAD -- WORKING_DIRECTORY ${SRC}
                    RESULT_VARIABLE _dirty ERROR_QUIET)
    if(NOT _dirty EQUAL 0)
      string(APPEND SYMTP_GIT_COMMIT "-dirty")
    endif()
  endif()
endif()
set(SYMTP_BUILD_TYPE "${BUILD_TYPE}")
set(SYMTP_CUDA_VERSION "${CUDA_VERSION}")
set(SYMTP_NCCL_VERSION "${NCCL_VERSION}")
set(SYMTP_CUDA_ARCH "${CUDA_ARCH}")
configure_file(${SRC}/common/build_info_generated.h.in ${OUT} @ONLY)
