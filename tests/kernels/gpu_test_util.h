// Helpers for the GPU tests of kernels/ops and models/cuda: a fixture that
// skips without a device, random inputs, host bf16 rounding, device arrays
// that are poisoned (all bytes 0xFF: NaN in fp32 and bf16, -1 in int32)
// before a kernel writes them, and tolerance checks that name the worst
// element.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda_raii.h"
#include "kernels/comm.h"
#include "tests/testing/status_matchers.h"

namespace symtp::kernels::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::VisibleDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto s = cuda::Stream::Create();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(*s);
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess); }
  cudaStream_t stream() const { return stream_.get(); }

  cuda::Stream stream_;
};

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

// Uniform in [lo, hi), never all zeros.
inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rounds in place to what the device holds for `dt`.
inline void RoundTo(std::vector<float>* v, DType dt) {
  if (dt == DType::kBF16) {
    for (auto& x : *v) x = RoundBf16(x);
  }
}

// Host-side fills and copies (cudaMemset, cudaMemcpy) go through the legacy
// default stream, which a test's non-blocking stream does not wait for (and
// a pageable cudaMemcpy may return before its DMA lands): finish them before
// anything is enqueued that reads or writes the same memory.
inline void FinishHostCopies() { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// A device array of `n` elements of dtype `dt`, uploaded from / downloaded
// to host floats (each transfer finished before it returns).
class DevArray {
 public:
  DevArray() = default;
  DevArray(size_t n, DType dt) : n_(n), dt_(dt) {
    auto b = cuda::DeviceBuffer::Create(std::max<size_t>(n * DTypeSize(dt), 16));
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) buf_ = std::move(*b);
    Poison();
  }
  void* get() const { return buf_.get(); }
  template <typename T>
  T* as() const {
    return buf_.as<T>();
  }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * DTypeSize(dt_); }
  void Poison() {
    EXPECT_EQ(cudaMemset(buf_.get(), 0xff, buf_.bytes()), cudaSuccess);
    FinishHostCopies();
  }
  void Upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    if (dt_ == DType::kF32) {
      ASSERT_EQ(cudaMemcpy(buf_.get(), v.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n_);
      for (size_t i = 0; i < n_; ++i) h[i] = FloatToBf16Bits(v[i]);
      ASSERT_EQ(cudaMemcpy(buf_.get(), h.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    FinishHostCopies();
  }
  std::vector<float> Download() const {
    FinishHostCopies();
    std::vector<float> v(n_);
    if (dt_ == DType::kF32) {
      EXPECT_EQ(cudaMemcpy(v.data(), buf_.get(), bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n_);
      EXPECT_EQ(cudaMemcpy(h.data(), buf_.get(), bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n_; ++i) v[i] = Bf16BitsToFloat(h[i]);
    }
    return v;
  }

 private:
  cuda::DeviceBuffer buf_;
  size_t n_ = 0;
  DType dt_ = DType::kF32;
};

// A CUDA graph of what `record` enqueues on `stream` (thread-local capture),
// instantiated; destroyed with the object. ok() says whether the capture,
// `record`'s own status and the instantiation all succeeded.
class CapturedGraph {
 public:
  template <typename Record>
  CapturedGraph(cudaStream_t stream, Record&& record) {
    absl::StatusOr<cuda::GraphExec> exec = cuda::GraphExec::Capture(stream, record);
    EXPECT_OK(exec.status());
    if (exec.ok()) exec_ = std::move(*exec);
  }
  bool ok() const { return exec_.get() != nullptr; }
  cudaError_t Launch(cudaStream_t stream) const { return cudaGraphLaunch(exec_.get(), stream); }

 private:
  cuda::GraphExec exec_;
};

template <typename T>
cuda::DeviceBuffer UploadRaw(const std::vector<T>& v) {
  auto b = cuda::DeviceBuffer::Create(std::max<size_t>(v.size() * sizeof(T), 16));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return cuda::DeviceBuffer();
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  FinishHostCopies();
  return std::move(*b);
}
template <typename T>
std::vector<T> DownloadRaw(const void* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

inline double Rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// Element i passes when |got - want| <= rtol * (|want| + rms(want)) (a
// relative error that does not explode on elements near zero); NaN never
// passes. Returns the worst normalized error, reports the worst element.
inline double CheckClose(const std::vector<float>& got, const std::vector<double>& want,
                         double rtol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1e30;
  const double rms = std::max(Rms(want), 1e-30);
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + rms);
    const double en = std::isnan(e) || std::isnan(got[i]) ? 1e30 : e;
    if (en > rtol) ++bad;
    if (en > worst) {
      worst = en;
      worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements over rtol "
                     << rtol << "; worst at " << worst_i << ": got " << got[worst_i] << " want "
                     << want[worst_i] << " (error " << worst << ")";
  return worst;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Relative error of the whole vector, ||got - want|| / ||want||.
inline double NormRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace symtp::kernels::testing
