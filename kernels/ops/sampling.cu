// Device sampling (kernels/ops/sampling.h). One 1024-thread block per row;
// for a few rows, a cluster of 2-8 blocks per row finds the row's maximum
// (all a greedy row needs), then the cluster's first block goes on alone.
#include <cooperative_groups.h>

#include <atomic>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"
#include "kernels/ops/internal/device_utils.cuh"
#include "kernels/ops/sampling.h"

namespace symtp::kernels {
namespace {

using internal::Mix64;

constexpr int kThreads = 1024;
constexpr int kCap = kSampleExactCap;

// Sort key: higher key = earlier in the reference's order (logit descending,
// ties by lower id). NaN is ordered as -inf and -0.0 as +0.0, as the CPU's
// float comparisons do. Every real key is > 0.
__device__ __forceinline__ uint64_t SortKey(float l, int i) {
  float x = isnan(l) ? -INFINITY : l;
  if (x == 0.f) x = 0.f;
  const uint32_t b = __float_as_uint(x);
  const uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(o) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ int KeyId(uint64_t k) {
  return static_cast<int>(~static_cast<uint32_t>(k & 0xffffffffu));
}
// The logit a key was made from (NaN comes back as -inf and -0.0 as +0.0,
// which give Weight() the same values).
__device__ __forceinline__ float KeyToLogit(uint64_t key) {
  const uint32_t o = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
// The same key with id `id + offset` (a shard's local id made global).
__device__ __forceinline__ uint64_t WithIdOffset(uint64_t key, int offset) {
  const uint32_t id = static_cast<uint32_t>(KeyId(key) + offset);
  return (key & 0xffffffff00000000ull) | static_cast<uint32_t>(~id);
}
__device__ __forceinline__ double KeyLogit(float l) {
  return isnan(l) ? -static_cast<double>(INFINITY) : static_cast<double>(l);
}
// w = exp((l - lmax) / T) in double; NaN (e.g. -inf - -inf) -> 1 for the top
// token, 0 otherwise, as model::SampleToken does.
__device__ __forceinline__ double Weight(float l, double lmax, double temp, bool is_top) {
  double w = exp((KeyLogit(l) - lmax) / temp);
  if (isnan(w)) w = is_top ? 1.0 : 0.0;
  return w;
}

__device__ __forceinline__ float SampleUniform(uint64_t seed, uint64_t position) {
  const uint64_t h = Mix64(seed * 0x9E3779B97F4A7C15ull + position);
  return __fmul_rn(static_cast<float>(static_cast<uint32_t>(h >> 40)), 0x1p-24f);
}

struct SampleSmem {
  uint64_t cand[kCap];
  double cum[kCap];
  uint32_t cnt[256];
  double mass[256];
  uint64_t red_u64[32];
  double red_f64[32];
  uint64_t bcast_key;
  double bcast_f64;
  uint32_t bcast_u32;
  int bcast_flag;
};

// The block's largest (kMax) or smallest value; every thread gets it.
template <bool kMax>
__device__ uint64_t BlockExtremeU64(uint64_t v, SampleSmem& sm) {
  const auto pick = [](uint64_t a, uint64_t b) { return (kMax ? a > b : a < b) ? a : b; };
  for (int o = 16; o > 0; o >>= 1) v = pick(__shfl_xor_sync(0xffffffffu, v, o), v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.red_u64[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sm.red_u64[threadIdx.x & 31];
  for (int o = 16; o > 0; o >>= 1) v = pick(__shfl_xor_sync(0xffffffffu, v, o), v);
  return v;
}

__device__ double BlockSumF64(double v, SampleSmem& sm) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.red_f64[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sm.red_f64[threadIdx.x & 31];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The k-th largest of the n keys key_at(0..n) (1 <= k <= n), by an 8-pass
// radix select on counts.
template <class KeyAt>
__device__ uint64_t SelectKthLargest(KeyAt key_at, int n, uint32_t k, SampleSmem& sm) {
  uint64_t prefix = 0, mask = 0;
  uint32_t remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sm.cnt[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint64_t key = key_at(i);
      if ((key & mask) == prefix) atomicAdd(&sm.cnt[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t cum = 0;
      int d = 255;
      for (; d > 0; --d) {
        if (cum + sm.cnt[d] >= remaining) break;
        cum += sm.cnt[d];
      }
      sm.bcast_key = prefix | (static_cast<uint64_t>(d) << shift);
      sm.bcast_u32 = remaining - cum;
    }
    __syncthreads();
    prefix = sm.bcast_key;
    remaining = sm.bcast_u32;
    mask |= 0xffull << shift;
    __syncthreads();  // bcast_* and cnt are reused next (here or by the caller)
  }
  return prefix;
}

// The largest key K >= lo such that the weight of the keys in [K, inf) ∩
// [lo, inf) reaches `target` (>= target, or > target if strict). False if no
// key does (rounding at the very end of the distribution).
__device__ bool SelectByMass(const float* __restrict__ L, int vocab, uint64_t lo, double target,
                             bool strict, double lmax, double temp, int top_id, SampleSmem& sm,
                             uint64_t* out) {
  uint64_t prefix = 0, mask = 0;
  double above = 0.0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) {
      sm.cnt[i] = 0;
      sm.mass[i] = 0.0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = L[i];
      const uint64_t key = SortKey(l, i);
      if (key >= lo && (key & mask) == prefix) {
        const int dgt = static_cast<int>((key >> shift) & 255);
        atomicAdd(&sm.cnt[dgt], 1u);
        atomicAdd(&sm.mass[dgt], Weight(l, lmax, temp, i == top_id));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double cum = above;
      int chosen = -1;
      for (int d = 255; d >= 0; --d) {
        if (sm.cnt[d] == 0) continue;
        const double c2 = cum + sm.mass[d];
        if (strict ? c2 > target : c2 >= target) {
          chosen = d;
          break;
        }
        cum = c2;
      }
      sm.bcast_flag = chosen >= 0;
      if (chosen >= 0) {
        sm.bcast_key = prefix | (static_cast<uint64_t>(chosen) << shift);
        sm.bcast_f64 = cum;
      }
    }
    __syncthreads();
    if (!sm.bcast_flag) return false;
    prefix = sm.bcast_key;
    above = sm.bcast_f64;
    mask |= 0xffull << shift;
    __syncthreads();
  }
  *out = prefix;
  return true;
}

__device__ double KeptMass(const float* __restrict__ L, int vocab, uint64_t lo, double lmax,
                           double temp, int top_id, SampleSmem& sm) {
  double s = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = L[i];
    if (SortKey(l, i) >= lo) s += Weight(l, lmax, temp, i == top_id);
  }
  return BlockSumF64(s, sm);
}

// sm.cand[0..sm.bcast_u32) = the keys >= lo among key_at(0..n) (at most kCap
// of them are kept), in any order.
template <class KeyAt>
__device__ void GatherKeysAtLeast(KeyAt key_at, int n, uint64_t lo, SampleSmem& sm) {
  if (threadIdx.x == 0) sm.bcast_u32 = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint64_t key = key_at(i);
    if (key >= lo) {
      const uint32_t slot = atomicAdd(&sm.bcast_u32, 1u);
      if (slot < static_cast<uint32_t>(kCap)) sm.cand[slot] = key;
    }
  }
  __syncthreads();
}

// The exact path's draw over the gathered keys: sorts them (bitonic, in
// shared memory) and runs the reference's loop on one thread (double
// weights of logit_of(key), sequential cumulative sums, top-p, the draw).
template <class LogitOf>
__device__ void DrawExact(SampleSmem& sm, const DeviceSamplingParams& p, double u, double lmax,
                          double temp, LogitOf logit_of, int32_t* token) {
  const int tid = threadIdx.x;
  const int n = min(static_cast<int>(sm.bcast_u32), kCap);
  int pw = 1;
  while (pw < n) pw <<= 1;
  for (int i = n + tid; i < pw; i += kThreads) sm.cand[i] = 0;
  __syncthreads();
  for (int k = 2; k <= pw; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < pw; i += kThreads) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = sm.cand[i], b = sm.cand[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) {
            sm.cand[i] = b;
            sm.cand[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = tid; i < n; i += kThreads) sm.cum[i] = Weight(logit_of(sm.cand[i]), lmax, temp, i == 0);
  __syncthreads();
  if (tid == 0) {
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
      total += sm.cum[i];
      sm.cum[i] = total;
    }
    int kept = n;
    if (p.top_p < 1.f) {
      const double target = static_cast<double>(p.top_p) * total;
      int m = 1;
      while (m < kept && sm.cum[m - 1] < target) ++m;
      kept = m;
      total = sm.cum[kept - 1];
    }
    const double t = u * total;
    int tok = KeyId(sm.cand[kept - 1]);
    for (int i = 0; i < kept; ++i) {
      if (sm.cum[i] > t) {
        tok = KeyId(sm.cand[i]);
        break;
      }
    }
    *token = tok;
  }
}

// This thread's largest key over L[begin, end) (multiples of 4 when vec4).
__device__ __forceinline__ uint64_t MaxKey(const float* __restrict__ L, int begin, int end,
                                           bool vec4) {
  uint64_t best = 0;
  if (vec4) {
    const float4* L4 = reinterpret_cast<const float4*>(L);
#pragma unroll 8
    for (int j = begin / 4 + static_cast<int>(threadIdx.x); j < end / 4; j += kThreads) {
      const float4 v = __ldg(L4 + j);
      const uint64_t k0 = SortKey(v.x, 4 * j), k1 = SortKey(v.y, 4 * j + 1);
      const uint64_t k2 = SortKey(v.z, 4 * j + 2), k3 = SortKey(v.w, 4 * j + 3);
      const uint64_t a = k0 > k1 ? k0 : k1, b = k2 > k3 ? k2 : k3;
      const uint64_t m = a > b ? a : b;
      best = m > best ? m : best;
    }
  } else {
    for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) {
      const uint64_t k = SortKey(L[i], i);
      best = k > best ? k : best;
    }
  }
  return best;
}

// kCluster: the grid is rows x cluster size; each block of a row's cluster
// takes a slice of the row for the maximum, block 0 combines them through
// distributed shared memory and finishes the row alone.
template <bool kCluster>
__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab,
                 const DeviceSamplingParams* __restrict__ params, int32_t* __restrict__ tokens,
                 bool vec4) {
  SYMTP_TRACE_KERNEL(kSample);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SampleSmem& sm = *reinterpret_cast<SampleSmem*>(smem_raw);
  int64_t row = blockIdx.x;
  int split = 1, rank = 0;
  if constexpr (kCluster) {
    split = static_cast<int>(cooperative_groups::this_cluster().num_blocks());
    rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
    row = blockIdx.x / split;
  }
  const float* L = logits + row * vocab;
  const int tid = threadIdx.x;

  const int64_t units = vec4 ? vocab / 4 : vocab, unit = vec4 ? 4 : 1;
  const int begin = static_cast<int>(units * rank / split * unit);
  const int end = static_cast<int>(units * (rank + 1) / split * unit);
  uint64_t best = BlockExtremeU64<true>(MaxKey(L, begin, end, vec4), sm);
  if constexpr (kCluster) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (tid == 0) sm.bcast_key = best;
    cluster.sync();  // every block's maximum is in its shared memory
    if (rank == 0 && tid == 0) {
      for (int r = 1; r < split; ++r) {
        const uint64_t k = *cluster.map_shared_rank(&sm.bcast_key, r);
        best = k > best ? k : best;
      }
      sm.bcast_key = best;
    }
    cluster.sync();  // the remote reads are done before any block exits
    if (rank != 0) return;
    best = sm.bcast_key;
  }
  const DeviceSamplingParams p = params[row];
  const int top_id = KeyId(best);
  if (!(p.temperature > 0.f)) {
    if (tid == 0) tokens[row] = top_id;
    return;
  }
  const double lmax = KeyLogit(L[top_id]);
  const double temp = static_cast<double>(p.temperature);
  const double u = static_cast<double>(SampleUniform(p.seed, p.position));
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  const int k_eff = use_top_k ? p.top_k : vocab;
  const uint64_t lo =
      use_top_k ? SelectKthLargest([&](int i) { return SortKey(L[i], i); }, vocab,
                                   static_cast<uint32_t>(k_eff), sm)
                : 0;

  if (k_eff <= kCap) {
    // Exact path: gather the kept ids, sort them, run the reference loop.
    const auto key_at = [&](int i) { return SortKey(L[i], i); };
    GatherKeysAtLeast(key_at, vocab, lo, sm);
    DrawExact(sm, p, u, lmax, temp, [&](uint64_t key) { return L[KeyId(key)]; }, tokens + row);
    return;
  }

  // General path: selections by cumulative weight over the whole row.
  double total = KeptMass(L, vocab, lo, lmax, temp, top_id, sm);
  uint64_t klo = lo;
  if (p.top_p < 1.f) {
    uint64_t kp = 0;
    if (SelectByMass(L, vocab, lo, static_cast<double>(p.top_p) * total, false, lmax, temp, top_id,
                     sm, &kp)) {
      klo = kp;
      total = KeptMass(L, vocab, klo, lmax, temp, top_id, sm);
    }
  }
  const double t = u * total;
  uint64_t kd = 0;
  if (!SelectByMass(L, vocab, klo, t, true, lmax, temp, top_id, sm, &kd)) {
    uint64_t mn = ~0ull;
    for (int i = tid; i < vocab; i += kThreads) {
      const uint64_t k = SortKey(L[i], i);
      if (k >= klo && k < mn) mn = k;
    }
    kd = BlockExtremeU64<false>(mn, sm);
  }
  if (tid == 0) tokens[row] = KeyId(kd);
}

// One row per block: the shard's `kmax` candidate slots of the row get the
// keys (global ids) of its top max(1, top_k) logits, the rest 0.
__global__ void __launch_bounds__(kThreads)
    ShardCandidatesKernel(const float* __restrict__ logits, int vocab_local, int offset,
                          const DeviceSamplingParams* __restrict__ params, int kmax,
                          uint64_t* __restrict__ cand, bool vec4) {
  SYMTP_TRACE_KERNEL(kSampleShardCandidates);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SampleSmem& sm = *reinterpret_cast<SampleSmem*>(smem_raw);
  const int64_t row = blockIdx.x;
  const float* L = logits + row * vocab_local;
  uint64_t* out = cand + row * kmax;
  const DeviceSamplingParams p = params[row];
  const int k = p.temperature > 0.f ? min(max(p.top_k, 1), min(kmax, vocab_local)) : 1;
  int written = 1;
  if (k == 1) {
    const uint64_t best = BlockExtremeU64<true>(MaxKey(L, 0, vocab_local, vec4), sm);
    if (threadIdx.x == 0) out[0] = WithIdOffset(best, offset);
  } else {
    const auto key_at = [&](int i) { return SortKey(L[i], i); };
    const uint64_t lo = SelectKthLargest(key_at, vocab_local, static_cast<uint32_t>(k), sm);
    GatherKeysAtLeast(key_at, vocab_local, lo, sm);
    written = min(static_cast<int>(sm.bcast_u32), k);
    for (int i = threadIdx.x; i < written; i += kThreads) out[i] = WithIdOffset(sm.cand[i], offset);
  }
  for (int i = written + threadIdx.x; i < kmax; i += kThreads) out[i] = 0;
}

// One row per block over the shards' candidates (cand[s][row][0..kmax)):
// the draw SampleKernel makes from the full row.
__global__ void __launch_bounds__(kThreads)
    CandidatesSampleKernel(const uint64_t* __restrict__ cand, int shards, int64_t rows, int kmax,
                           int vocab, const DeviceSamplingParams* __restrict__ params,
                           int32_t* __restrict__ tokens) {
  SYMTP_TRACE_KERNEL(kSampleFromCandidates);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SampleSmem& sm = *reinterpret_cast<SampleSmem*>(smem_raw);
  const int64_t row = blockIdx.x;
  const int n = shards * kmax;
  const auto key_at = [&](int i) {
    return cand[(static_cast<int64_t>(i / kmax) * rows + row) * kmax + i % kmax];
  };
  uint64_t best = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) best = max(best, key_at(i));
  best = BlockExtremeU64<true>(best, sm);
  const DeviceSamplingParams p = params[row];
  if (!(p.temperature > 0.f)) {
    if (threadIdx.x == 0) tokens[row] = KeyId(best);
    return;
  }
  const double lmax = KeyLogit(KeyToLogit(best));
  const double temp = static_cast<double>(p.temperature);
  const double u = static_cast<double>(SampleUniform(p.seed, p.position));
  // ShardedSamplingTakes: 1 <= top_k <= kmax, so every shard sent top_k real
  // keys (or all of its own) and the union holds the row's top top_k.
  const int k = max(1, min(p.top_k, min(kmax, vocab)));
  const uint64_t lo = SelectKthLargest(key_at, n, static_cast<uint32_t>(k), sm);
  GatherKeysAtLeast(key_at, n, lo, sm);
  DrawExact(sm, p, u, lmax, temp, [](uint64_t key) { return KeyToLogit(key); }, tokens + row);
}

// Blocks per row: 2, 4 or 8 (a thread-block cluster) while the rows' blocks
// still fit in one wave (1024-thread blocks: one per SM on an H200), when
// clusters of that size fit on this device (checked once per device).
absl::StatusOr<int> SampleSplit(int64_t rows, int vocab) {
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: unknown, else 1 + blocks in one wave
  int wave = 0;
  const int c = dev < kMaxDevices ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (c > 0) {
    wave = c - 1;
  } else {
    int major = 0, sms = 0, per_sm = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, SampleKernel<true>, kThreads, sizeof(SampleSmem)));
    if (major >= 9) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(8);
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = sizeof(SampleSmem);
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 8;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, SampleKernel<true>, &cfg) == cudaSuccess &&
          clusters >= 1) {
        wave = sms * per_sm;
      }
      (void)cudaGetLastError();
    }
    if (dev < kMaxDevices) cached[dev].store(wave + 1, std::memory_order_relaxed);
  }
  int split = 1;
  while (split < 8 && rows * split * 2 <= wave && vocab / (split * 2) >= kThreads) split *= 2;
  return split;
}

}  // namespace

absl::Status SampleTokens(const float* logits, int64_t rows, int vocab,
                          const DeviceSamplingParams* params, int32_t* tokens,
                          cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SampleTokens: bad shape rows=%d vocab=%d", rows, vocab));
  }
  if (rows == 0) return absl::OkStatus();
  constexpr size_t kSmem = sizeof(SampleSmem);
  static_assert(kSmem <= 48 * 1024, "sampling shared memory");
  const bool vec4 = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  SYMTP_ASSIGN_OR_RETURN(const int split, SampleSplit(rows, vocab));
  if (split == 1) {
    SampleKernel<false><<<static_cast<unsigned>(rows), kThreads, kSmem, stream>>>(
        logits, vocab, params, tokens, vec4);
    return CUDA_STATUS(cudaGetLastError());
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(split);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return CUDA_STATUS(
      cudaLaunchKernelEx(&cfg, SampleKernel<true>, logits, vocab, params, tokens, vec4));
}

bool ShardedSamplingTakes(const DeviceSamplingParams& p, int vocab, int kmax) {
  if (!(p.temperature > 0.f)) return true;
  return p.top_k >= 1 && p.top_k <= kmax && p.top_k <= kSampleExactCap && p.top_k < vocab;
}

absl::Status SelectShardCandidates(const float* logits, int64_t rows, int vocab_local,
                                   int vocab_offset, const DeviceSamplingParams* params, int kmax,
                                   uint64_t* cand, cudaStream_t stream) {
  if (rows < 0 || vocab_local <= 0 || vocab_offset < 0 || kmax < 1 || kmax > kSampleExactCap ||
      rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SelectShardCandidates: bad shape rows=%d vocab_local=%d offset=%d kmax=%d", rows,
        vocab_local, vocab_offset, kmax));
  }
  if (rows == 0) return absl::OkStatus();
  const bool vec4 = vocab_local % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  ShardCandidatesKernel<<<static_cast<unsigned>(rows), kThreads, sizeof(SampleSmem), stream>>>(
      logits, vocab_local, vocab_offset, params, kmax, cand, vec4);
  return CUDA_STATUS(cudaGetLastError());
}

absl::Status SampleFromCandidates(const uint64_t* cand, int shards, int64_t rows, int kmax,
                                  int vocab, const DeviceSamplingParams* params, int32_t* tokens,
                                  cudaStream_t stream) {
  if (rows < 0 || shards < 1 || kmax < 1 || kmax > kSampleExactCap || vocab <= 0 ||
      rows > 0x7fffffff || static_cast<int64_t>(shards) * kmax > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SampleFromCandidates: bad shape rows=%d shards=%d kmax=%d vocab=%d", rows, shards, kmax,
        vocab));
  }
  if (rows == 0) return absl::OkStatus();
  CandidatesSampleKernel<<<static_cast<unsigned>(rows), kThreads, sizeof(SampleSmem), stream>>>(
      cand, shards, rows, kmax, vocab, params, tokens);
  return CUDA_STATUS(cudaGetLastError());
}

}  // namespace symtp::kernels
