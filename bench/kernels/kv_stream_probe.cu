// kv_stream_probe: how fast can a decode-attention block stream a paged
// K/V cache into shared memory, with the attention's math left out? The
// tensor-core decode kernel reads llama-8b's cache at 94-96% of the copy
// bandwidth where torch's SDPA over a contiguous cache reaches 100%
// (bench/results/h100x2/attention_gap/). The probe copies the same bytes in
// the same order (one block per (sequence, kv head), 4 warps taking 16-key
// tiles in turn, a 3-stage ring per warp, 16-token pages scattered at
// random, the cache token-major: [slot][kv head][128]) three ways:
//   cpasync   the kernel's own copies: 16-byte cp.async, whole 128-byte
//             lines per instruction (KvLineCopy), wait_group + __syncwarp
//   tma64     one lane of each warp issues TMA boxes of 16 slots x 64 dims
//             (128-byte swizzle: the form ldmatrix could read without bank
//             conflicts), 4 a tile, completing on a per-stage mbarrier
//   tma128    the same with 16 x 128 boxes, no swizzle, 2 a tile
// Each warp XORs the tile's words out of shared memory (the data other lanes
// or the copy engine wrote); each block's XOR is checked against the CPU's
// over the same keys before any time is reported. Probe: its answer goes to
// docs/FINDINGS.md.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

constexpr int kD = 128;          // head dim
constexpr int kPage = 16;        // tokens per page = keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 3;
constexpr int kRowBytes = 2 * kD;              // 256
constexpr int kPitch = kRowBytes + 16;         // the decode kernel's padded rows
constexpr int kTileBytes = kPage * kPitch;     // cp.async layout, one matrix
constexpr int kDenseTile = kPage * kRowBytes;  // TMA layout, one matrix (4 KB)

enum Mode { kCpAsync = 0, kTma64 = 1, kTma128 = 2 };

__device__ __forceinline__ void CpAsync16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void Commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WaitGroup() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void MbarInit(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarExpect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits for phase `parity` of `bar`; gives up (returns false) after ~0.5 s.
__device__ __forceinline__ bool MbarWait(unsigned bar, unsigned parity) {
  const long long start = clock64();
  for (;;) {
    unsigned done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return true;
    if (clock64() - start > 1000000000ll) return false;
  }
}
__device__ __forceinline__ void Tma3D(unsigned dst, const CUtensorMap* map, unsigned bar, int c0,
                                      int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// XOR of the 16-byte units [lane, lane + 32, ...) of `bytes` bytes at `base`
// (rows of `pitch` bytes holding kRowBytes of data each).
__device__ __forceinline__ uint32_t XorTile(const unsigned char* base, int pitch, int lane) {
  uint4 x = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < kPage * kRowBytes / 16 / 32; ++i) {
    const int unit = lane + 32 * i, row = unit / (kRowBytes / 16), col = unit % (kRowBytes / 16);
    const uint4 v = *reinterpret_cast<const uint4*>(base + row * pitch + col * 16);
    x.x ^= v.x, x.y ^= v.y, x.z ^= v.z, x.w ^= v.w;
  }
  return x.x ^ x.y ^ x.z ^ x.w;
}

struct Args {
  const uint16_t* k;
  const uint16_t* v;
  const int32_t* table;  // [batch][pages_per_seq]
  int heads, pages_per_seq;
  uint32_t* out;  // [batch * heads]
  int* errors;
};

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2)
    StreamKernel(Args a, const __grid_constant__ CUtensorMap kmap,
                 const __grid_constant__ CUtensorMap vmap) {
  // The rings from a 1024-byte boundary (the 128-byte swizzle's atom), the
  // barriers and the warps' results after them.
  extern __shared__ unsigned char smem_raw[];
  constexpr int kStageBytes = kMode == kCpAsync ? 2 * kTileBytes : 2 * kDenseTile;
  const unsigned raw_s = static_cast<unsigned>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw_s + 1023) & ~1023u) - raw_s);
  uint64_t(*bars)[kStages] = reinterpret_cast<uint64_t(*)[kStages]>(smem + kWarps * kStages * kStageBytes);
  uint32_t* warp_x = reinterpret_cast<uint32_t*>(bars + kWarps);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seq = blockIdx.x / a.heads, head = blockIdx.x % a.heads;
  const int32_t* table = a.table + static_cast<int64_t>(seq) * a.pages_per_seq;
  unsigned char* ring = smem + warp * kStages * kStageBytes;
  const unsigned ring_s = static_cast<unsigned>(__cvta_generic_to_shared(ring));
  const int ntiles = a.pages_per_seq / kWarps;  // tile i of this warp: page warp + 4 i
  uint32_t acc = 0;

  if constexpr (kMode == kCpAsync) {
    const int crow = lane / 8, cpiece = lane % 8;
    const int64_t slot_elems = static_cast<int64_t>(a.heads) * kD;
    auto issue = [&](int i) {
      if (i < ntiles) {
        const int page = table[warp + kWarps * i];
        const unsigned dst = ring_s + (i % kStages) * kStageBytes + crow * kPitch + cpiece * 16;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t e =
              (static_cast<int64_t>(page) * kPage + crow + 4 * r) * slot_elems + head * kD + cpiece * 8;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            CpAsync16(dst + r * 4 * kPitch + h * 128, a.k + e + h * 64);
            CpAsync16(dst + kTileBytes + r * 4 * kPitch + h * 128, a.v + e + h * 64);
          }
        }
      }
      Commit();
    };
    for (int i = 0; i < kStages - 1; ++i) issue(i);
    for (int i = 0; i < ntiles; ++i) {
      WaitGroup<kStages - 2>();
      __syncwarp();
      issue(i + kStages - 1);
      const unsigned char* st = ring + (i % kStages) * kStageBytes;
      acc ^= XorTile(st, kPitch, lane) ^ XorTile(st + kTileBytes, kPitch, lane);
    }
  } else {
    const unsigned bar0 = static_cast<unsigned>(__cvta_generic_to_shared(&bars[warp][0]));
    if (lane == 0) {
      for (int s = 0; s < kStages; ++s) MbarInit(bar0 + 8 * s, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    auto issue = [&](int i) {
      if (i >= ntiles || lane != 0) return;
      const int slot = table[warp + kWarps * i] * kPage;
      const int s = i % kStages;
      // The stage's earlier reads (generic proxy) before the copy engine's writes.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const unsigned bar = bar0 + 8 * s, dst = ring_s + s * kStageBytes;
      MbarExpect(bar, 2 * kDenseTile);
      if constexpr (kMode == kTma64) {
        // Box 64 dims x 1 head x 16 slots (2 KB, 128-byte swizzle): K lo, K
        // hi, V lo, V hi.
        Tma3D(dst, &kmap, bar, 0, head, slot);
        Tma3D(dst + kDenseTile / 2, &kmap, bar, 64, head, slot);
        Tma3D(dst + kDenseTile, &vmap, bar, 0, head, slot);
        Tma3D(dst + kDenseTile + kDenseTile / 2, &vmap, bar, 64, head, slot);
      } else {
        Tma3D(dst, &kmap, bar, 0, head, slot);
        Tma3D(dst + kDenseTile, &vmap, bar, 0, head, slot);
      }
    };
    for (int i = 0; i < kStages - 1; ++i) issue(i);
    bool ok = true;
    for (int i = 0; i < ntiles && ok; ++i) {
      __syncwarp();  // tile i - 1's stage is read by every lane before its refill
      issue(i + kStages - 1);
      ok = MbarWait(bar0 + 8 * (i % kStages), (i / kStages) & 1);
      const unsigned char* st = ring + (i % kStages) * kStageBytes;
      // The swizzle permutes 16-byte units within 1 KB: the XOR is unchanged.
      acc ^= XorTile(st, kRowBytes, lane) ^ XorTile(st + kDenseTile, kRowBytes, lane);
    }
    if (!ok && lane == 0) atomicAdd(a.errors, 1);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) warp_x[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t x = 0;
    for (int w = 0; w < kWarps; ++w) x ^= warp_x[w];
    a.out[blockIdx.x] = x;
  }
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

CUtensorMap MakeMap(EncodeTiledFn encode, const void* base, int64_t slots, int heads, int box_d) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {kD, static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(slots)};
  const cuuint64_t strides[2] = {kRowBytes, static_cast<cuuint64_t>(heads) * kRowBytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_d), 1, kPage};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                            strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            box_d == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int batch = 512, heads = 4, context = 1024, reps = 21;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (f == "--batch") batch = v;
    else if (f == "--heads") heads = v;
    else if (f == "--context") context = v;
    else if (f == "--reps") reps = v;
  }
  if (context % (kPage * kWarps) != 0 || batch < 1 || heads < 1) {
    std::fprintf(stderr, "context must be a multiple of %d\n", kPage * kWarps);
    return 2;
  }
  const int pps = context / kPage;
  const int64_t pages = static_cast<int64_t>(batch) * pps;
  const int64_t slots = pages * kPage;
  const int64_t words = slots * heads * kD / 2;  // 32-bit words per matrix

  // Random cache contents (never zeros) and a random page of every table entry.
  std::vector<uint32_t> hk(words), hv(words);
  uint64_t s = 12345;
  for (int64_t i = 0; i < words; ++i) hk[i] = static_cast<uint32_t>(SplitMix(s));
  for (int64_t i = 0; i < words; ++i) hv[i] = static_cast<uint32_t>(SplitMix(s));
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(7);
  std::shuffle(perm.begin(), perm.end(), rng);

  // CPU reference: XOR of every word of (seq, head)'s keys and values.
  std::vector<uint32_t> ref(static_cast<size_t>(batch) * heads, 0);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < pps; ++p) {
      const int64_t page = perm[static_cast<size_t>(b) * pps + p];
      for (int t = 0; t < kPage; ++t) {
        for (int h = 0; h < heads; ++h) {
          const int64_t w0 = ((page * kPage + t) * heads + h) * (kD / 2);
          uint32_t x = 0;
          for (int w = 0; w < kD / 2; ++w) x ^= hk[w0 + w] ^ hv[w0 + w];
          ref[static_cast<size_t>(b) * heads + h] ^= x;
        }
      }
    }
  }

  uint16_t *dk, *dv;
  int32_t* dtable;
  uint32_t* dout;
  int* derr;
  const size_t bytes = static_cast<size_t>(words) * 4;
  CHECK(cudaMalloc(&dk, bytes));
  CHECK(cudaMalloc(&dv, bytes));
  CHECK(cudaMalloc(&dtable, pages * 4));
  CHECK(cudaMalloc(&dout, ref.size() * 4));
  CHECK(cudaMalloc(&derr, 4));
  CHECK(cudaMemcpy(dk, hk.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, hv.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dtable, perm.data(), pages * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(derr, 0, 4));

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  auto encode = reinterpret_cast<EncodeTiledFn>(fn);
  const CUtensorMap k64 = MakeMap(encode, dk, slots, heads, 64), v64 = MakeMap(encode, dv, slots, heads, 64);
  const CUtensorMap k128 = MakeMap(encode, dk, slots, heads, 128),
                    v128 = MakeMap(encode, dv, slots, heads, 128);

  // The copy bandwidth of this GPU (1 GiB device-to-device, read + write).
  float copy_bw = 0;
  {
    void *x, *y;
    const size_t n = size_t{1} << 30;
    CHECK(cudaMalloc(&x, n));
    CHECK(cudaMalloc(&y, n));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 11; ++r) {
      CHECK(cudaEventRecord(e0));
      CHECK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice));
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r > 0) t.push_back(ms);
    }
    copy_bw = 2.0f * n / (Median(t) * 1e-3f);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }

  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, copy bandwidth %.0f GB/s; batch %d, kv heads %d, context %d, K+V %.1f MB\n",
              prop.name, copy_bw / 1e9, batch, heads, context, 2.0 * bytes / 1e6);
  std::printf("%-8s %10s %10s %8s %8s\n", "mode", "us", "GB/s", "of copy", "check");

  Args a{dk, dv, dtable, heads, pps, dout, derr};
  const int grid = batch * heads;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const char* names[3] = {"cpasync", "tma64", "tma128"};
  int failures = 0;
  for (int mode = 0; mode < 3; ++mode) {
    const int smem =
        kWarps * kStages * (mode == kCpAsync ? 2 * kTileBytes : 2 * kDenseTile) + 1024 + 256;
    auto launch = [&] {
      if (mode == kCpAsync) {
        CHECK(cudaFuncSetAttribute(StreamKernel<kCpAsync>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        StreamKernel<kCpAsync><<<grid, kThreads, smem>>>(a, k64, v64);
      } else if (mode == kTma64) {
        CHECK(cudaFuncSetAttribute(StreamKernel<kTma64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        StreamKernel<kTma64><<<grid, kThreads, smem>>>(a, k64, v64);
      } else {
        CHECK(cudaFuncSetAttribute(StreamKernel<kTma128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        StreamKernel<kTma128><<<grid, kThreads, smem>>>(a, k128, v128);
      }
      CHECK(cudaGetLastError());
    };
    CHECK(cudaMemset(dout, 0, ref.size() * 4));
    launch();
    CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> got(ref.size());
    int err = 0;
    CHECK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
    int wrong = err;
    for (size_t i = 0; i < ref.size(); ++i) wrong += got[i] != ref[i];
    if (wrong) {
      std::printf("%-8s %10s %10s %8s %8s (%d blocks wrong)\n", names[mode], "-", "-", "-", "FAIL", wrong);
      ++failures;
      continue;
    }
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      CHECK(cudaEventRecord(e0));
      launch();
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    const float us = Median(t) * 1e3f;
    const double gbs = 2.0 * bytes / (us * 1e-6) / 1e9;
    std::printf("%-8s %10.1f %10.0f %7.1f%% %8s\n", names[mode], us, gbs, 100.0 * gbs * 1e9 / copy_bw,
                "ok");
  }
  return failures ? 1 : 0;
}
