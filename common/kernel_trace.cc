#include "common/kernel_trace.h"

#include <cstdio>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace symtp::trace {
namespace {

struct State {
  std::mutex mu;
  std::vector<ModuleSetter> setters;
  Record* ring = nullptr;
  unsigned long long* count = nullptr;
  unsigned mask = 0;
};

State& Get() {
  static State* s = new State;
  return *s;
}

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("kernel trace: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

bool RegisterModule(ModuleSetter setter) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  s.setters.push_back(setter);
  return true;
}

absl::Status Enable(int log2_records) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  if (!kCompiled) {
    return absl::FailedPreconditionError(
        "kernel trace: this build's kernels do not record (cmake -DSYMTP_KERNEL_TRACE=ON)");
  }
  if (s.ring != nullptr) return absl::FailedPreconditionError("kernel trace: already enabled");
  const size_t n = size_t{1} << log2_records;
  if (auto st = Cuda(cudaMalloc(&s.ring, n * sizeof(Record)), "ring"); !st.ok()) return st;
  if (auto st = Cuda(cudaMalloc(&s.count, sizeof(unsigned long long)), "count"); !st.ok()) {
    return st;
  }
  if (auto st = Cuda(cudaMemset(s.count, 0, sizeof(unsigned long long)), "count"); !st.ok()) {
    return st;
  }
  s.mask = static_cast<unsigned>(n - 1);
  for (ModuleSetter f : s.setters) {
    if (auto st = Cuda(f(s.ring, s.count, s.mask), "module"); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status DumpAndDisable(const std::string& path) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.ring == nullptr) return absl::OkStatus();
  if (auto st = Cuda(cudaDeviceSynchronize(), "sync"); !st.ok()) return st;
  unsigned long long count = 0;
  if (auto st = Cuda(cudaMemcpy(&count, s.count, sizeof count, cudaMemcpyDeviceToHost), "count");
      !st.ok()) {
    return st;
  }
  const size_t cap = size_t{s.mask} + 1;
  std::vector<Record> all(cap);
  if (auto st = Cuda(cudaMemcpy(all.data(), s.ring, cap * sizeof(Record), cudaMemcpyDeviceToHost),
                     "ring");
      !st.ok()) {
    return st;
  }
  const size_t n = count < cap ? count : cap;
  std::vector<Record> out;
  out.reserve(n);
  for (size_t i = count - n; i < count; ++i) out.push_back(all[i & s.mask]);
  for (ModuleSetter f : s.setters) f(nullptr, nullptr, 0);
  cudaFree(s.ring);
  cudaFree(s.count);
  s.ring = nullptr;
  s.count = nullptr;
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) return absl::InternalError(absl::StrCat("kernel trace: cannot write ", path));
  const uint64_t head[3] = {count, cap, out.size()};  // written, capacity, records here
  std::fwrite(head, sizeof head, 1, fp);
  std::fwrite(out.data(), sizeof(Record), out.size(), fp);
  std::fclose(fp);
  return absl::OkStatus();
}

}  // namespace symtp::trace
