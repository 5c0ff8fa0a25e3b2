// How fast one GPU streams bytes it only reads, against the copy bandwidth
// the kernel tables' floor uses, whole and per launch at the sizes of a
// model's weight GEMMs. Built and run by tools/device/read_bandwidth.sh
// (nvcc, outside the CMake build: a measurement, not a product kernel).
//  - cudaMemcpy and a copy kernel: read + write bytes over time.
//  - A read-only kernel (16-byte __ldg loads, U in flight per thread, the
//    values folded so the loads are kept) over 2 GiB at several grids.
//  - The same kernel over chunks of S MiB walked in order through the 2 GiB
//    (no L2 reuse), 32 launches back to back: each launch's bandwidth,
//    launch gaps included, as a weight GEMM of S MiB would see it; also at
//    the GEMV's occupancy, with and without its arithmetic, and with each
//    block reading a contiguous share as a GEMV block reads its rows.
// Times: median of 15 after 3 warm-ups, CUDA events.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

// Reads n 16-byte units, U loads in flight per thread before any is used.
// kDot = false folds them with XOR (a read and nothing else); kDot = true
// does a GEMV's arithmetic at one row: each load is eight bf16 weights,
// unpacked and multiplied with an activation held in registers into one of
// four running sums (the GEMV's four weight rows a pass, 16 dependent
// multiply-adds each at U = 8). Either result only keeps the work alive.
//
// kBlocked: each block reads its own contiguous share of the n units (a GEMV
// block's rows), blockDim x U units a pass, instead of the grid-stride walk
// in which all blocks read one window together.
template <int U, bool kDot, bool kBlocked = false>
__global__ void Read(const uint4* __restrict__ p, size_t n, unsigned* out) {
  unsigned fold = 0;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const float x = 1.f + threadIdx.x * 1e-3f;
  const size_t pass = static_cast<size_t>(blockDim.x) * U;
  const size_t begin = kBlocked ? n * blockIdx.x / gridDim.x : blockIdx.x * pass;
  const size_t end = kBlocked ? n * (blockIdx.x + 1) / gridDim.x : n;
  const size_t stride = kBlocked ? pass : gridDim.x * pass;
  for (size_t i = begin + threadIdx.x; i < end; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t j = i + static_cast<size_t>(u) * blockDim.x;
      v[u] = j < end ? __ldg(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if constexpr (kDot) {
        const unsigned w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[u % 4] = fmaf(__uint_as_float(w[q] << 16), x, acc[u % 4]);
          acc[u % 4] = fmaf(__uint_as_float(w[q] & 0xffff0000u), x, acc[u % 4]);
        }
      } else {
        fold ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
      }
    }
  }
  // Never true for the fill below.
  if (fold == 0x9e3779b9u || acc[0] + acc[1] + acc[2] + acc[3] == 1234.5f) out[0] = 1;
}

__global__ void CopyKernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    b[i] = a[i];
  }
}

int main() {
  const size_t bytes = size_t{2} << 30, n = bytes / 16;
  uint4 *a = nullptr, *b = nullptr;
  unsigned* out = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&out, 4));
  CHECK(cudaMemset(a, 1, bytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t s, e;
  CHECK(cudaEventCreate(&s));
  CHECK(cudaEventCreate(&e));
  auto tbps = [&](auto launch, double moved) {
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> t;
    for (int i = 0; i < 15; ++i) {
      cudaEventRecord(s);
      launch();
      cudaEventRecord(e);
      cudaEventSynchronize(e);
      float ms = 0;
      cudaEventElapsedTime(&ms, s, e);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return moved / (t[7] * 1e-3) / 1e12;
  };
  std::printf("{\"sms\": %d, \"whole_2gib\": {\n", sms);
  std::printf("  \"cudamemcpy_d2d_read_write\": %.3f,\n",
              tbps([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, 2.0 * bytes));
  std::printf("  \"copy_kernel_read_write\": %.3f,\n",
              tbps([&] { CopyKernel<<<sms * 8, 256>>>(a, b, n); }, 2.0 * bytes));
  bool first = true;
  for (int per_sm : {2, 4, 8}) {
    for (int threads : {256, 512, 1024}) {
      if (per_sm * threads > 2048) continue;
      const double r4 = tbps([&] { Read<4, false><<<sms * per_sm, threads>>>(a, n, out); }, bytes);
      const double r8 = tbps([&] { Read<8, false><<<sms * per_sm, threads>>>(a, n, out); }, bytes);
      std::printf("%s  \"read_%dx%d_u4\": %.3f, \"read_%dx%d_u8\": %.3f", first ? "" : ",\n",
                  per_sm, threads, r4, per_sm, threads, r8);
      first = false;
    }
  }
  std::printf("},\n\"per_launch\": {\n");
  first = true;
  // 2 x 256 threads per SM with 128 bytes of loads in flight per thread, and
  // 2 x 512 with 64, are the GEMV's occupancies; "dot" adds its arithmetic,
  // "blocked" its contiguous share per block.
  struct Form {
    const char* name;
    int per_sm, threads;
    void (*kernel)(const uint4*, size_t, unsigned*);
  };
  for (size_t mb : {8, 16, 34, 50, 117, 235, 470}) {
    const size_t cb = mb << 20, cn = cb / 16, chunks = bytes / cb;
    for (const Form& f : {Form{"2x256_u8", 2, 256, Read<8, false>},
                          Form{"2x256_u8_dot", 2, 256, Read<8, true>},
                          Form{"2x512_u4", 2, 512, Read<4, false>},
                          Form{"2x512_u4_blocked", 2, 512, Read<4, false, true>},
                          Form{"2x512_u4_blocked_dot", 2, 512, Read<4, true, true>},
                          Form{"4x512_u4", 4, 512, Read<4, false>}}) {
      size_t k = 0;
      const double bw = tbps(
          [&] {
            for (int i = 0; i < 32; ++i, ++k) {
              f.kernel<<<sms * f.per_sm, f.threads>>>(a + (k % chunks) * cn, cn, out);
            }
          },
          32.0 * cb);
      std::printf("%s  \"mb%zu_%s\": %.3f", first ? "" : ",\n", mb, f.name, bw);
      first = false;
    }
  }
  std::printf("}}\n");
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}
