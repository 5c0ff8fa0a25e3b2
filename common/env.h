// Every environment variable symtp reads is read here, and only here.
// docs/ENV.md lists them; keep the two in step.
//
//   SYMTP_LOG         log threshold spec, e.g. "info" or "warn,ipc=trace" (default "info")
//   SYMTP_SHM_PREFIX  prefix of shared-memory segment names (default "symtp")
//   CUDA_VISIBLE_DEVICES  read by the launcher to report what it pins, and by the
//                     run summary to name each rank's GPU (summary.json "devices")
//   SYMTP_BENCH_NO_GATE, CUDA_INJECTION64_PATH  kernels_bench: whether a profiler runs it
//   SYMTP_KERNEL_TRACE_OUT  where a -DSYMTP_KERNEL_TRACE=ON build writes its kernel timeline
#pragma once

#include <optional>
#include <string>

namespace symtp::env {

// SYMTP_LOG, or "info".
std::string LogSpec();

// SYMTP_SHM_PREFIX, or "symtp". Only [A-Za-z0-9_-] are kept.
std::string ShmPrefix();

// CUDA_VISIBLE_DEVICES if set.
std::optional<std::string> CudaVisibleDevices();

// True when a profiler runs this process: CUDA_INJECTION64_PATH is set (how
// Nsight tools inject) or SYMTP_BENCH_NO_GATE is (for profilers that inject
// otherwise). kernels_bench then times without holding its stream.
bool BenchUnderProfiler();

// SYMTP_KERNEL_TRACE_OUT (study builds, common/kernel_trace.h): where GpuModel
// writes its kernel timeline (<path>.rank<r>.bin) at teardown.
std::optional<std::string> KernelTraceOut();

}  // namespace symtp::env
