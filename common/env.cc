#include "common/env.h"

#include <cctype>
#include <cstdlib>

namespace symtp::env {
namespace {
std::optional<std::string> Get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}
}  // namespace

std::string LogSpec() { return Get("SYMTP_LOG").value_or("info"); }

std::string ShmPrefix() {
  std::string raw = Get("SYMTP_SHM_PREFIX").value_or("symtp");
  std::string out;
  for (char c : raw) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') out.push_back(c);
  }
  return out.empty() ? "symtp" : out;
}

std::optional<std::string> CudaVisibleDevices() { return Get("CUDA_VISIBLE_DEVICES"); }

bool BenchUnderProfiler() {
  return Get("CUDA_INJECTION64_PATH").has_value() || Get("SYMTP_BENCH_NO_GATE").has_value();
}

std::optional<std::string> KernelTraceOut() { return Get("SYMTP_KERNEL_TRACE_OUT"); }

}  // namespace symtp::env
