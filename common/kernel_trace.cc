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

// Points the modules away from the ring and frees it (what Enable allocated,
// whether or not it finished).
void Release(State& s) {
  for (ModuleSetter f : s.setters) f(nullptr, nullptr, 0);
  if (s.ring != nullptr) cudaFree(s.ring);
  if (s.count != nullptr) cudaFree(s.count);
  s.ring = nullptr;
  s.count = nullptr;
  s.mask = 0;
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
  if (log2_records < 1 || log2_records > 30) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel trace: log2_records ", log2_records, " outside [1, 30]"));
  }
  const size_t n = size_t{1} << log2_records;
  absl::Status st = Cuda(cudaMalloc(&s.ring, n * sizeof(Record)), "ring");
  if (st.ok()) st = Cuda(cudaMalloc(&s.count, sizeof(unsigned long long)), "count");
  if (st.ok()) st = Cuda(cudaMemset(s.count, 0, sizeof(unsigned long long)), "count");
  s.mask = static_cast<unsigned>(n - 1);
  for (ModuleSetter f : s.setters) {
    if (st.ok()) st = Cuda(f(s.ring, s.count, s.mask), "module");
  }
  if (!st.ok()) Release(s);
  return st;
}

absl::Status Pause() {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.ring == nullptr) return absl::OkStatus();
  absl::Status st;
  for (ModuleSetter f : s.setters) {
    if (st.ok()) st = Cuda(f(nullptr, nullptr, 0), "pause");
  }
  return st;
}

absl::Status DumpAndDisable(const std::string& path) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.ring == nullptr) return absl::OkStatus();
  // The caller has waited (with its deadline) for the kernels that record.
  unsigned long long count = 0;
  const size_t cap = size_t{s.mask} + 1;
  std::vector<Record> all(cap);
  absl::Status st =
      Cuda(cudaMemcpy(&count, s.count, sizeof count, cudaMemcpyDeviceToHost), "count");
  if (st.ok()) {
    st = Cuda(cudaMemcpy(all.data(), s.ring, cap * sizeof(Record), cudaMemcpyDeviceToHost), "ring");
  }
  Release(s);
  if (!st.ok()) return st;
  const size_t n = count < cap ? count : cap;
  std::vector<Record> out;
  out.reserve(n);
  for (size_t i = count - n; i < count; ++i) out.push_back(all[i % cap]);
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) return absl::InternalError(absl::StrCat("kernel trace: cannot write ", path));
  const uint64_t head[3] = {count, cap, out.size()};  // written, capacity, records here
  const bool wrote = std::fwrite(head, sizeof head, 1, fp) == 1 &&
                     std::fwrite(out.data(), sizeof(Record), out.size(), fp) == out.size();
  if (std::fclose(fp) != 0 || !wrote) {
    return absl::InternalError(absl::StrCat("kernel trace: short write to ", path));
  }
  return absl::OkStatus();
}

}  // namespace symtp::trace
