// Kernels of the custom all-reduce. Included by one .cu per dtype.
//
// Four protocols, three one-shot (every rank sums the whole message) and one
// two-shot (TWO-SHOT, below StagedKernel: every rank sums 1/N of it), all with
// fp32 accumulation in rank order 0..N-1 starting from rank 0's value, so that
// every rank (and every protocol) produce bitwise identical results:
//
// STAGED (large sizes): block b writes its slice of `data` into its slot of
//   every peer's staging [parity][src slot] (posted NVLink stores: nothing
//   waits on a round trip), then (one thread per peer) st.release.sys's the
//   call's epoch into flags[b][rank] of every peer, ld.acquire.sys-polls its
//   own flags[b][peer] until every peer has published epoch >= e, and then
//   reduces slice b from its own `data` and its own staging slots (local
//   reads, ld.global.cg so no stale L1 line is used) into `data`.
//   Release/acquire at system scope plus __syncthreads on both sides make the
//   writer's staging stores visible before its flag (cumulativity of the
//   release over the CTA barrier).
//
// LL (small sizes, low latency): no fences and no separate flags. Each
//   16-byte line written to a peer carries 8 data bytes and the epoch twice,
//   {lo, e, hi, e}, as one st.volatile.v4; 8-byte halves land atomically, so a
//   reader that sees both epochs in a line (ld.volatile.v4 polling its own,
//   local memory) has that line's data. Lines are written straight into each
//   peer's receive slots [parity][src][line]; one one-way NVLink latency per
//   call.
//
// LL128 (mid sizes): LL with 120 data bytes and the epoch (twice) in each
//   128-byte line, written by 8 lanes of one warp store instruction and
//   polled by one warp load instruction (details at LL128Receive); 1.07x the
//   message's bytes cross NVLink instead of LL's 2x. Own receive region and
//   per-block counters (epoch_ll128), same reuse argument as LL.
//
// Epochs and reuse. Each block b keeps its call counter in the owner's device
// memory (epoch_staged[b], epoch_ll[b], epoch_ll128[b]), read at kernel start and written back
// at the end, so CUDA-graph replays advance it with no host state. Every call
// launches the same number of blocks for its protocol (fixed grid), so all
// blocks of all ranks agree on e = counter + 1 for the k-th call. Buffers are
// double-buffered by epoch parity; the argument that call k + 2 (which reuses
// call k's parity) cannot overwrite data a peer still reads in call k:
//   rank r starts call k + 2 (and its stores into p's slots) only after its
//   call k + 1 finished (calls on one instance are stream-ordered, see
//   CustomAllReduce); call k + 1 has at least one thread that waited for peer
//   p's call-(k + 1) signal (flag >= e_{k+1}, or an LL line carrying
//   e_{k+1}); p emits that signal only in its kernel k + 1, which starts
//   after p's kernel k (all its reads of call k) finished.
// Flags compare wrap-aware ((int32)(flag - e) >= 0), LL lines compare equal,
// parity is e & 1 (2^32 is even), so the counters may wrap.
//
// Launch: every kernel (these and the fused ones) is started with
// programmatic dependent launch and waits (griddepcontrol.wait) for the
// previous kernel on its stream before it touches memory: its blocks are
// scheduled during that kernel's tail, and the stream order the reuse
// argument rests on is unchanged.
//
// Every spin is bounded: %globaltimer deadline (DeviceArgs::timeout_ns; the
// pipelined two-shot's gathers twice it, see TwoShotKernel) and a
// host-mapped abort word (AbortRequested); on either the thread records
// {code, peer, protocol, block, epoch} (atomicCAS on the device copy, mirrored
// to host-mapped memory) and the block skips its reduction, leaving `data`
// partially reduced.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/allreduce/custom_allreduce_device.h"
#include "kernels/allreduce/custom_allreduce_launch.h"
#include "kernels/ops/internal/device_utils.cuh"  // GridDependencyWait, LaunchDependent

namespace symtp::kernels::allreduce_internal {

// ---------------------------------------------------------------------------
// Memory-model and timer primitives
// ---------------------------------------------------------------------------

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t LdAcquireSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StReleaseSys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void StVolatileV4(void* p, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

__device__ __forceinline__ uint4 LdVolatileV4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Loads that skip L1 (peers' staging through the IPC mapping).
__device__ __forceinline__ uint4 LdCg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t LdCg4(const void* p) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint16_t LdCg2(const void* p) {
  uint16_t v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// The abort word is host memory: a read is a PCIe round trip, and reads of
// that one address queue behind each other (2048 warps of an LL128 kernel
// reading it together took about 1 ms to drain, long enough to make the
// waiting rank the late one at the next call, so two ranks a millisecond
// apart stayed that way call after call). So at most one thread per GPU reads
// it per kAbortPollUs, whichever claims the poll time in the owner's signal
// region, and a set word is mirrored there; every other check reads the
// mirror (an L2 hit).
inline constexpr uint32_t kAbortPollUs = 20;

__device__ __forceinline__ bool AbortRequested(const DeviceArgs& a, uint64_t now_ns) {
  if (a.abort_word == nullptr) return false;
  volatile unsigned int* const seen = a.abort_mirror;
  if (seen[0] != 0) return true;
  const unsigned int t = static_cast<unsigned int>(now_ns >> 10);  // wraps: differences only
  const unsigned int last = seen[1];
  if (t - last < kAbortPollUs) return false;
  if (atomicCAS(a.abort_mirror + 1, last, t) != last) return false;  // another thread reads it
  if (*a.abort_word == 0) return false;
  seen[0] = 1;
  return true;
}

// Bounds one spin-wait: Check() after every unsuccessful poll returns
// kErrTimeout once DeviceArgs::timeout_ns have passed since construction, or
// kErrAborted once the host set the abort word. The timer (a register read)
// is looked at every 32 polls, the abort word (AbortRequested: the mirror, and
// now and then the host word) every 1024, so a healthy wait is barely slowed.
struct SpinBound {
  uint64_t start;
  uint32_t spins = 0;
  __device__ __forceinline__ SpinBound() : start(GlobalTimerNs()) {}
  __device__ __forceinline__ uint32_t Check(const DeviceArgs& a) {
    ++spins;
    if ((spins & 31) != 0) return kErrNone;
    const uint64_t now = GlobalTimerNs();
    if (now - start > a.timeout_ns) return kErrTimeout;
    if ((spins & 1023) == 0 && AbortRequested(a, now)) return kErrAborted;
    return kErrNone;
  }
};

// a.base[idx] for a run-time idx < N without indexing the parameter array
// dynamically (which would copy DeviceArgs to the local stack).
template <int N>
__device__ __forceinline__ char* BaseOf(const DeviceArgs& a, int idx) {
  char* p = a.base[0];
#pragma unroll
  for (int r = 1; r < N; ++r) p = idx == r ? a.base[r] : p;
  return p;
}

static __device__ __noinline__ void RecordErrorWord(unsigned long long* dev, unsigned long long* host,
                                             unsigned long long word) {
  if (atomicCAS(dev, 0ull, word) == 0ull && host != nullptr) {
    *reinterpret_cast<volatile unsigned long long*>(host) = word;
    __threadfence_system();
  }
}

template <int N>
__device__ __forceinline__ void RecordError(const DeviceArgs& a, uint32_t code, uint32_t peer,
                                            uint32_t protocol, uint32_t block, uint32_t epoch) {
  RecordErrorWord(reinterpret_cast<unsigned long long*>(BaseOf<N>(a, a.rank) + kErrorOffset),
                  a.error_host, PackError(code, peer, protocol, block, epoch));
}

// ---------------------------------------------------------------------------
// Element conversions (fp32 accumulation)
// ---------------------------------------------------------------------------

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Bits = uint32_t;
  static __device__ __forceinline__ float ToF(Bits b) { return __uint_as_float(b); }
  static __device__ __forceinline__ Bits FromF(float f) { return __float_as_uint(f); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Bits = uint16_t;
  static __device__ __forceinline__ float ToF(Bits b) { return __uint_as_float(uint32_t(b) << 16); }
  static __device__ __forceinline__ Bits FromF(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};
template <>
struct Elem<__half> {
  using Bits = uint16_t;
  static __device__ __forceinline__ float ToF(Bits b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ Bits FromF(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
};

// Sum of N packed words of elements (kWords 32-bit words each), rank order.
template <typename T, int N, int kWords>
__device__ __forceinline__ void ReducePacked(const uint32_t (&in)[N][kWords],
                                             uint32_t (&out)[kWords]) {
  using E = Elem<T>;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      float acc = E::ToF(in[0][w]);
#pragma unroll
      for (int r = 1; r < N; ++r) acc += E::ToF(in[r][w]);
      out[w] = E::FromF(acc);
    }
  } else {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      float lo = E::ToF(static_cast<uint16_t>(in[0][w] & 0xffff));
      float hi = E::ToF(static_cast<uint16_t>(in[0][w] >> 16));
#pragma unroll
      for (int r = 1; r < N; ++r) {
        lo += E::ToF(static_cast<uint16_t>(in[r][w] & 0xffff));
        hi += E::ToF(static_cast<uint16_t>(in[r][w] >> 16));
      }
      out[w] = uint32_t(E::FromF(lo)) | (uint32_t(E::FromF(hi)) << 16);
    }
  }
}

template <typename T>
__device__ __forceinline__ typename Elem<T>::Bits LoadBits(const void* p) {
  if constexpr (sizeof(T) == 4) {
    return *static_cast<const uint32_t*>(p);
  } else {
    return *static_cast<const uint16_t*>(p);
  }
}
template <typename T>
__device__ __forceinline__ typename Elem<T>::Bits LoadBitsCg(const void* p) {
  if constexpr (sizeof(T) == 4) {
    return LdCg4(p);
  } else {
    return LdCg2(p);
  }
}
template <typename T>
__device__ __forceinline__ void StoreBits(void* p, typename Elem<T>::Bits b) {
  if constexpr (sizeof(T) == 4) {
    *static_cast<uint32_t*>(p) = b;
  } else {
    *static_cast<uint16_t*>(p) = b;
  }
}

// Every thread reads the block's call counter itself (one broadcast load per
// warp, issued together with the first data loads); thread 0 writes it back
// after the block's final __syncthreads, when every thread has read it.

// ---------------------------------------------------------------------------
// STAGED protocol
// ---------------------------------------------------------------------------

// Byte offset, in rank `owner`'s buffer, of the staging slot that receives
// rank `src`'s data (src != owner) in calls of parity `parity`.
template <int N>
__device__ __forceinline__ size_t StageSlot(const DeviceArgs& a, uint32_t parity, int owner,
                                            int src) {
  return a.stage_offset +
         (static_cast<size_t>(parity) * (N - 1) + static_cast<size_t>(src - (src > owner))) *
             a.stage_bytes;
}

// This block's slice [begin, end) of a `count`-element message in the STAGED
// protocol: an even share per block, starting on a 16-byte unit of kE
// elements (the same on every rank).
struct Slice {
  size_t begin, end;
};
template <size_t kE>
__device__ __forceinline__ Slice BlockSlice(size_t count) {
  size_t per_block = (count + gridDim.x - 1) / gridDim.x;
  per_block = (per_block + kE - 1) / kE * kE;
  const size_t e0 = min(count, static_cast<size_t>(blockIdx.x) * per_block);
  return {e0, min(count, e0 + per_block)};
}

// Flag word [idx][src] of the flag array at `flags_offset` (kFlagsOffset or
// kScatterFlagsOffset) in rank `owner`'s buffer: written by rank src, polled
// by the owner.
template <int N>
__device__ __forceinline__ uint32_t* FlagWord(const DeviceArgs& a, int owner, size_t flags_offset,
                                              int idx, int src) {
  return reinterpret_cast<uint32_t*>(BaseOf<N>(a, owner) + flags_offset) + idx * kMaxRanks + src;
}

// Publishes call epoch e into word [idx][rank] of every peer's flag array,
// one thread per peer (release: after a __syncthreads it orders the whole
// block's earlier stores before the flag).
template <int N>
__device__ __forceinline__ void SignalPeers(const DeviceArgs& a, size_t flags_offset, int idx,
                                            uint32_t e) {
  const int tid = threadIdx.x;
  if (tid < N && tid != a.rank) StReleaseSys(FlagWord<N>(a, tid, flags_offset, idx, a.rank), e);
}

// Spins (one thread) until the own flag word [idx][src] holds e or later.
// False on a timeout (after `patience` times the bound) or abort, after
// recording the error (block b, protocol `tag`).
template <int N>
__device__ __forceinline__ bool WaitFlag(const DeviceArgs& a, size_t flags_offset, int idx, int src,
                                         uint32_t e, int b, uint32_t tag, int patience = 1) {
  const uint32_t* local = FlagWord<N>(a, a.rank, flags_offset, idx, src);
  SpinBound bound;
  while (static_cast<int32_t>(LdAcquireSys(local) - e) < 0) {
    if (const uint32_t err = bound.Check(a)) {
      if (err == kErrTimeout && --patience > 0) {
        bound = SpinBound();
        continue;
      }
      RecordError<N>(a, err, src, tag, b, e);
      return false;
    }
  }
  return true;
}

// STAGED's rendezvous of block b: publishes e into flags[b][rank] of every
// peer and waits until every peer has published e (or later) into this
// rank's flags[b][peer]: one thread per peer; call from every thread between
// two __syncthreads. Sets *fail on a timeout or abort.
template <int N>
__device__ __forceinline__ void StagedSignalAndWait(const DeviceArgs& a, int b, uint32_t e,
                                                    int* fail) {
  SignalPeers<N>(a, kFlagsOffset, b, e);
  const int tid = threadIdx.x;
  if (tid < N && tid != a.rank && !WaitFlag<N>(a, kFlagsOffset, b, tid, e, b, kTagStaged)) {
    *fail = 1;
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kStagedThreads) StagedKernel(DeviceArgs a, void* data_v,
                                                                size_t count) {
  SYMTP_TRACE_KERNEL(kAllReduceStaged);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  constexpr size_t kE = 16 / sizeof(T);  // elements per 16-byte unit
  char* const data = static_cast<char*>(data_v);
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  char* const my_base = BaseOf<N>(a, me);
  uint32_t* const counter = reinterpret_cast<uint32_t*>(my_base + kEpochStagedOffset) + b;
  __shared__ int s_fail;
  if (tid == 0) s_fail = 0;  // ordered before any use by the copy phase's barrier
  const uint32_t e = *counter + 1;
  const uint32_t parity = e & 1;

  const bool vec = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const auto [e0, e1] = BlockSlice<kE>(count);

  if (e0 < e1) {
    const size_t nvec = vec ? (e1 - e0) / kE : 0;  // full 16-byte units
    const size_t u0 = e0 / kE;
    const size_t s0 = e0 + nvec * kE;  // scalar remainder [s0, e1)
    // Where this rank's slice lands in every peer's staging (own entry unused).
    char* peer_slot[N];
#pragma unroll
    for (int p = 0; p < N; ++p) peer_slot[p] = a.base[p] + StageSlot<N>(a, parity, p, me);

    // 1. Push the slice into every peer's staging slot (remote stores).
    for (size_t i = tid; i < nvec; i += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(data)[u0 + i];
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p != me) reinterpret_cast<uint4*>(peer_slot[p])[u0 + i] = v;
      }
    }
    for (size_t k = s0 + tid; k < e1; k += blockDim.x) {
      const auto v = LoadBits<T>(data + k * sizeof(T));
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p != me) StoreBits<T>(peer_slot[p] + k * sizeof(T), v);
      }
    }
    __syncthreads();

    // 2. Signal every peer, 3. wait for every peer.
    StagedSignalAndWait<N>(a, b, e, &s_fail);
    __syncthreads();

    // 4. Reduce slice b, rank order (own `data`, the peers' slots), into `data`.
    if (!s_fail) {
      const char* stage[N];
#pragma unroll
      for (int r = 0; r < N; ++r) {
        stage[r] = r == me ? data : my_base + StageSlot<N>(a, parity, me, r);
      }
      const size_t step = blockDim.x;
      for (size_t i = tid; i < nvec; i += 2 * step) {
        const bool two = i + step < nvec;
        uint32_t va[N][4], vb[N][4];
#pragma unroll
        for (int r = 0; r < N; ++r) {
          const uint4 x = LdCg16(stage[r] + (u0 + i) * 16);
          va[r][0] = x.x, va[r][1] = x.y, va[r][2] = x.z, va[r][3] = x.w;
        }
        if (two) {
#pragma unroll
          for (int r = 0; r < N; ++r) {
            const uint4 x = LdCg16(stage[r] + (u0 + i + step) * 16);
            vb[r][0] = x.x, vb[r][1] = x.y, vb[r][2] = x.z, vb[r][3] = x.w;
          }
        }
        uint32_t oa[4];
        ReducePacked<T, N, 4>(va, oa);
        reinterpret_cast<uint4*>(data)[u0 + i] = make_uint4(oa[0], oa[1], oa[2], oa[3]);
        if (two) {
          uint32_t ob[4];
          ReducePacked<T, N, 4>(vb, ob);
          reinterpret_cast<uint4*>(data)[u0 + i + step] = make_uint4(ob[0], ob[1], ob[2], ob[3]);
        }
      }
      using E = Elem<T>;
      for (size_t k = s0 + tid; k < e1; k += step) {
        float acc = E::ToF(LoadBitsCg<T>(stage[0] + k * sizeof(T)));
#pragma unroll
        for (int r = 1; r < N; ++r) acc += E::ToF(LoadBitsCg<T>(stage[r] + k * sizeof(T)));
        StoreBits<T>(data + k * sizeof(T), E::FromF(acc));
      }
    }
  }
  __syncthreads();
  if (tid == 0) *counter = e;
}

// ---------------------------------------------------------------------------
// TWO-SHOT protocol
// ---------------------------------------------------------------------------

// Thread `threadIdx.x`'s share of the copy of elements [x0, x1) from `src` to
// `dst` (x0 a multiple of kE): 16-byte units when `vec`, kU of them loaded
// before any is stored (the stores may alias the loads as far as the compiler
// knows, so a plain loop would wait for every load), then the elements left
// over. kCg: the source is staging written by peers (loads skip L1).
template <typename T, int kU, bool kCg>
__device__ __forceinline__ void CopyRange(char* dst, const char* src, size_t x0, size_t x1,
                                          bool vec) {
  constexpr size_t kE = 16 / sizeof(T);
  const size_t u1 = vec ? x1 / kE : x0 / kE, stride = blockDim.x;
  size_t u = x0 / kE + threadIdx.x;
  auto load = [&](size_t w) {
    return kCg ? LdCg16(src + w * 16) : reinterpret_cast<const uint4*>(src)[w];
  };
  for (; u + (kU - 1) * stride < u1; u += kU * stride) {
    uint4 v[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) v[k] = load(u + k * stride);
#pragma unroll
    for (int k = 0; k < kU; ++k) reinterpret_cast<uint4*>(dst)[u + k * stride] = v[k];
  }
  for (; u < u1; u += stride) reinterpret_cast<uint4*>(dst)[u] = load(u);
  for (size_t k = max(x0, u1 * kE) + threadIdx.x; k < x1; k += stride) {
    const size_t off = k * sizeof(T);
    StoreBits<T>(dst + off, kCg ? LoadBitsCg<T>(src + off) : LoadBits<T>(src + off));
  }
}

// arr[idx] for a run-time idx < N, as selects (an indexed register array
// would go to local memory).
template <int N, typename P>
__device__ __forceinline__ P Pick(const P (&arr)[N], int idx) {
  P v = arr[0];
#pragma unroll
  for (int r = 1; r < N; ++r) v = idx == r ? arr[r] : v;
  return v;
}

// One call's view of the TWO-SHOT message: N parts (part j owned by rank j)
// of P elements, each cut into `chunks` chunks of CE (whole 16-byte units;
// the last ones of a part short or empty), and the three steps on a chunk.
template <typename T, int N>
struct TwoShotPlan {
  static constexpr size_t kE = 16 / sizeof(T);       // elements per 16-byte unit
  static constexpr int kCopyUnits = N <= 4 ? 4 : 2;  // loads in flight per thread in copies
  char* data;
  size_t count, P, CE;
  int me;
  bool vec;  // 16-byte aligned `data`
  // slot[p]: in rank p's buffer, the slot this rank writes (own entry
  // unused); from[r]: in this rank's buffer, the slot rank r writes (own
  // entry: data).
  char* slot[N];
  const char* from[N];

  __device__ __forceinline__ Slice Chunk(int j, int c) const {
    const size_t end = min(count, (j + 1) * P);
    const size_t lo = min(end, j * P + c * CE);
    return Slice{lo, min(end, lo + CE)};
  }
  // Chunk c of every peer's part into that peer's slot.
  __device__ __forceinline__ void Scatter(int c) const {
#pragma unroll
    for (int i = 1; i < N; ++i) {
      const int p = (me + i) % N;
      const Slice s = Chunk(p, c);
      CopyRange<T, kCopyUnits, false>(Pick<N>(slot, p), data, s.begin, s.end, vec);
    }
  }
  // Chunk c of the own part: the rank-order sum of `data` and the peers'
  // slots (the one-shot protocols' arithmetic: same bits) into `data` and
  // every peer's slot.
  __device__ __forceinline__ void Reduce(int c) const {
    using E = Elem<T>;
    const Slice s = Chunk(me, c);
    const size_t u1 = vec ? s.end / kE : s.begin / kE, stride = blockDim.x;
    auto load = [&](size_t u, uint32_t(&in)[N][4]) {
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const uint4 x = LdCg16(from[r] + u * 16);
        in[r][0] = x.x, in[r][1] = x.y, in[r][2] = x.z, in[r][3] = x.w;
      }
    };
    auto store = [&](size_t u, const uint32_t(&in)[N][4]) {
      uint32_t o[4];
      ReducePacked<T, N, 4>(in, o);
      const uint4 v = make_uint4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<uint4*>(data)[u] = v;
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p != me) reinterpret_cast<uint4*>(slot[p])[u] = v;
      }
    };
    size_t u = s.begin / kE + threadIdx.x;
    if constexpr (N <= 4) {  // two units in flight (at 8 ranks registers would spill)
      for (; u + stride < u1; u += 2 * stride) {
        uint32_t in0[N][4], in1[N][4];
        load(u, in0);
        load(u + stride, in1);
        store(u, in0);
        store(u + stride, in1);
      }
    }
    for (; u < u1; u += stride) {
      uint32_t in0[N][4];
      load(u, in0);
      store(u, in0);
    }
    for (size_t k = max(s.begin, u1 * kE) + threadIdx.x; k < s.end; k += stride) {
      float acc = E::ToF(LoadBitsCg<T>(from[0] + k * sizeof(T)));
#pragma unroll
      for (int r = 1; r < N; ++r) acc += E::ToF(LoadBitsCg<T>(from[r] + k * sizeof(T)));
      const auto v = E::FromF(acc);
      StoreBits<T>(data + k * sizeof(T), v);
#pragma unroll
      for (int p = 0; p < N; ++p) {
        if (p != me) StoreBits<T>(slot[p] + k * sizeof(T), v);
      }
    }
  }
  // Chunk c of part p (p's sum) from the own slot of rank p into `data`.
  __device__ __forceinline__ void Gather(int c, int p) const {
    const Slice s = Chunk(p, c);
    CopyRange<T, kCopyUnits, true>(data, Pick<N>(from, p), s.begin, s.end, vec);
  }
};

// Reduce-scatter, then all-gather, both over posted NVLink stores: every
// rank stores chunk c of part p of its data into rank p's staging slot (same
// offsets as in `data`) and releases scatter_flags[c][me] at p; rank p, once
// every peer's flag is there, sums its chunk and stores the sum into every
// peer's slot, releasing flags[c][p]; each rank then copies the peers' sums
// into `data`. A rank sends 2 (N - 1) / N of the message (the one-shot sends
// N - 1 times it). Two schedules on the staged grid:
//  - per block (messages under a.two_shot_pipeline_min_bytes): one chunk
//    per block, each block running the three steps on it in turn;
//  - pipelined (larger ones): chunks of about a.two_shot_chunk_bytes (at
//    least one per scatter block, at most kMaxBlocks, the flag arrays' rows)
//    and three groups of blocks, so the steps of different chunks run at
//    once and the link carries scattered and reduced chunks together:
//    a.two_shot_scatter_blocks scatter and never wait (then help gather),
//    a.two_shot_reduce_blocks wait for a chunk's scatter flags and reduce it,
//    the rest wait for a chunk's flags and gather it. No block waits on a
//    block of its own GPU, only on peers' blocks of an earlier step, and
//    scatters wait on nothing, so the grid need not be resident at once.
// Data hazards: part j of slot src is written by the scatter only for j ==
// owner and by the reduce only for j == src; `data`'s part p is read by the
// scatter of a chunk before the rank releases that chunk's scatter flag and
// overwritten by the gather only after p's reduce saw that flag. Reuse
// across calls is STAGED's argument (a rank finishes a call only after
// receiving every peer's flags of it, which each peer sends after finishing
// its previous call), on the same counters, grid and slots; every block's
// counter is equal and a flag only grows, so flags indexed by chunk and by
// block, and the protocols, interleave freely.
template <typename T, int N>
__global__ void __launch_bounds__(kStagedThreads) TwoShotKernel(DeviceArgs a, void* data_v,
                                                                 size_t count) {
  SYMTP_TRACE_KERNEL(kAllReduceTwoShot);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  using Plan = TwoShotPlan<T, N>;
  constexpr size_t kE = Plan::kE;
  const int b = blockIdx.x;
  const int me = a.rank;
  char* const my_base = BaseOf<N>(a, me);
  uint32_t* const counter = reinterpret_cast<uint32_t*>(my_base + kEpochStagedOffset) + b;
  const uint32_t e = *counter + 1;
  const uint32_t parity = e & 1;

  Plan plan;
  plan.data = static_cast<char*>(data_v);
  plan.count = count;
  plan.me = me;
  plan.vec = (reinterpret_cast<uintptr_t>(data_v) & 15) == 0;
#pragma unroll
  for (int p = 0; p < N; ++p) {
    plan.slot[p] = a.base[p] + StageSlot<N>(a, parity, p, me);
    plan.from[p] = p == me ? plan.data : my_base + StageSlot<N>(a, parity, me, p);
  }
  plan.P = ((count + N - 1) / N + kE - 1) / kE * kE;
  const bool pipelined = count * sizeof(T) >= a.two_shot_pipeline_min_bytes;
  const int n_scatter = a.two_shot_scatter_blocks, n_reduce = a.two_shot_reduce_blocks;
  int chunks = gridDim.x;
  if (pipelined) {
    const size_t by_bytes =
        (plan.P * sizeof(T) + a.two_shot_chunk_bytes - 1) / a.two_shot_chunk_bytes;
    chunks = static_cast<int>(
        min(static_cast<size_t>(kMaxBlocks), max(static_cast<size_t>(n_scatter), by_bytes)));
  }
  plan.CE = ((plan.P + chunks - 1) / chunks + kE - 1) / kE * kE;
  const int tid = threadIdx.x;
  const bool peer_thread = tid < N && tid != me;  // waits for and signals peer tid

  if (!pipelined) {
    plan.Scatter(b);
    __syncthreads();
    SignalPeers<N>(a, kScatterFlagsOffset, b, e);
    bool failed = peer_thread && !WaitFlag<N>(a, kScatterFlagsOffset, b, tid, e, b, kTagTwoShot);
    if (!__syncthreads_or(failed)) {
      plan.Reduce(b);
      __syncthreads();
      SignalPeers<N>(a, kFlagsOffset, b, e);
      failed = peer_thread && !WaitFlag<N>(a, kFlagsOffset, b, tid, e, b, kTagTwoShot);
      if (!__syncthreads_or(failed)) {
#pragma unroll
        for (int i = 1; i < N; ++i) plan.Gather(b, (me + i) % N);
      }
    }
  } else if (b >= n_scatter && b < n_scatter + n_reduce) {
    for (int c = b - n_scatter; c < chunks; c += n_reduce) {
      const bool failed =
          peer_thread && !WaitFlag<N>(a, kScatterFlagsOffset, c, tid, e, b, kTagTwoShot);
      if (__syncthreads_or(failed)) break;
      plan.Reduce(c);
      __syncthreads();
      SignalPeers<N>(a, kFlagsOffset, c, e);
    }
  } else {
    if (b < n_scatter) {
      for (int c = b; c < chunks; c += n_scatter) {
        plan.Scatter(c);
        __syncthreads();
        SignalPeers<N>(a, kScatterFlagsOffset, c, e);
      }
    }
    // Gather workers: the gather blocks, then the scatter blocks once their
    // scatter is out; items in chunk order.
    const int n_gather = gridDim.x - n_reduce;
    const int w = b < n_scatter ? static_cast<int>(gridDim.x) - n_scatter - n_reduce + b
                                : b - n_scatter - n_reduce;
    for (int k = w; k < chunks * (N - 1); k += n_gather) {
      const int c = k / (N - 1), p = (me + 1 + k % (N - 1)) % N;
      // Twice the bound: a peer that never arrives stalls every rank's
      // reduce, and the gathers' waits on the live peers' reduces must not
      // be the first error recorded (the reduce names the absent peer).
      const bool failed =
          tid == 0 && !WaitFlag<N>(a, kFlagsOffset, c, p, e, b, kTagTwoShot, /*patience=*/2);
      if (__syncthreads_or(failed)) break;
      plan.Gather(c, p);
    }
  }
  __syncthreads();
  if (tid == 0) *counter = e;
}

// ---------------------------------------------------------------------------
// LL protocol
// ---------------------------------------------------------------------------

// 8 data bytes of line `l` of `data` (count elements of T); zero padded past
// the end; element-wise when `data` is not 8-byte aligned.
template <typename T>
__device__ __forceinline__ uint2 LoadLine(const char* data, size_t l, size_t count, bool aligned8) {
  constexpr size_t kEL = 8 / sizeof(T);
  const size_t first = l * kEL;
  if (aligned8 && first + kEL <= count) return *reinterpret_cast<const uint2*>(data + l * 8);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (size_t j = 0; j < kEL; ++j) {
    if (first + j < count) {
      const uint32_t bits = LoadBits<T>(data + (first + j) * sizeof(T));
      const size_t bit = j * sizeof(T) * 8;
      w[bit / 32] |= bits << (bit % 32);
    }
  }
  return make_uint2(w[0], w[1]);
}

template <typename T>
__device__ __forceinline__ void StoreLine(char* data, size_t l, size_t count, bool aligned8,
                                          uint2 v) {
  constexpr size_t kEL = 8 / sizeof(T);
  const size_t first = l * kEL;
  if (aligned8 && first + kEL <= count) {
    *reinterpret_cast<uint2*>(data + l * 8) = v;
    return;
  }
  const uint32_t w[2] = {v.x, v.y};
#pragma unroll
  for (size_t j = 0; j < kEL; ++j) {
    if (first + j < count) {
      const size_t bit = j * sizeof(T) * 8;
      const uint32_t bits = w[bit / 32] >> (bit % 32);
      StoreBits<T>(data + (first + j) * sizeof(T),
                   static_cast<typename Elem<T>::Bits>(sizeof(T) == 4 ? bits : bits & 0xffff));
    }
  }
}

// Address of receive line `line` from rank `src` in the LL region of the
// buffer at `base`, for calls of parity `parity`.
template <int N>
__device__ __forceinline__ const char* LLSlot(const DeviceArgs& a, const char* base,
                                              size_t parity, int src, size_t line) {
  return base + a.ll_offset +
         ((parity * N + static_cast<size_t>(src)) * a.ll_lines + line) * kLLLineBytes;
}

// Waits until this rank's receive lines [line, line + kLines) from every
// peer carry epoch e and gathers their data words into in[src] (two per
// line; in[me] is the caller's, or with `self` read from this rank's own
// slot like a peer's). False after a timeout or abort (the error recorded
// against the first peer still missing).
template <int N, int kLines>
__device__ __forceinline__ bool LLReceive(const DeviceArgs& a, size_t parity, size_t line,
                                          uint32_t e, int b, uint32_t (&in)[N][2 * kLines],
                                          bool self = false) {
  const char* const my_base = BaseOf<N>(a, a.rank);
  bool ready[N];
#pragma unroll
  for (int r = 0; r < N; ++r) ready[r] = !self && r == a.rank;
  SpinBound bound;
  for (;;) {
    bool all = true;
    int missing = -1;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      if (ready[r]) continue;
      uint4 v[kLines];
      bool got = true;
#pragma unroll
      for (int k = 0; k < kLines; ++k) {
        v[k] = LdVolatileV4(LLSlot<N>(a, my_base, parity, r, line + k));
        got = got && v[k].y == e && v[k].w == e;
      }
      if (got) {
#pragma unroll
        for (int k = 0; k < kLines; ++k) in[r][2 * k] = v[k].x, in[r][2 * k + 1] = v[k].z;
        ready[r] = true;
      } else {
        all = false;
        if (missing < 0) missing = r;
      }
    }
    if (all) return true;
    if (const uint32_t err = bound.Check(a)) {
      RecordError<N>(a, err, missing, kTagLL, b, e);
      return false;
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kLLThreads) LLKernel(DeviceArgs a, void* data_v, size_t count) {
  SYMTP_TRACE_KERNEL(kAllReduceLL);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  char* const data = static_cast<char*>(data_v);
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int me = a.rank;
  char* const my_base = BaseOf<N>(a, me);
  const uint32_t e = reinterpret_cast<const uint32_t*>(my_base + kEpochLLOffset)[b] + 1;
  const size_t parity = e & 1;

  const size_t lines = (count * sizeof(T) + 7) / 8;
  const size_t per_block = (lines + gridDim.x - 1) / gridDim.x;
  const size_t l0 = min(lines, static_cast<size_t>(b) * per_block);
  const size_t l1 = min(lines, l0 + per_block);
  const bool aligned8 = (reinterpret_cast<uintptr_t>(data) & 7) == 0;

  // 1. Send every line of this thread to every peer (posted remote stores).
  for (size_t l = l0 + tid; l < l1; l += blockDim.x) {
    const uint2 d = LoadLine<T>(data, l, count, aligned8);
#pragma unroll
    for (int p = 0; p < N; ++p) {
      if (p != me) {
        StVolatileV4(const_cast<char*>(LLSlot<N>(a, a.base[p], parity, me, l)), d.x, e, d.y, e);
      }
    }
  }

  // 2. Receive (poll own memory) and reduce in rank order.
  for (size_t l = l0 + tid; l < l1; l += blockDim.x) {
    uint32_t in[N][2];
    const uint2 mine = LoadLine<T>(data, l, count, aligned8);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      if (r == me) in[r][0] = mine.x, in[r][1] = mine.y;
    }
    if (!LLReceive<N, 1>(a, parity, l, e, b, in)) break;
    uint32_t out[2];
    ReducePacked<T, N, 2>(in, out);
    StoreLine<T>(data, l, count, aligned8, make_uint2(out[0], out[1]));
  }
  __syncthreads();
  if (tid == 0) reinterpret_cast<uint32_t*>(BaseOf<N>(a, me) + kEpochLLOffset)[b] = e;
}

// ---------------------------------------------------------------------------
// LL128 protocol
// ---------------------------------------------------------------------------

// Address of receive line `line` from rank `src` in the LL128 region of the
// buffer at `base`, for calls of parity `parity`.
template <int N>
__device__ __forceinline__ char* LL128Slot(const DeviceArgs& a, char* base, size_t parity, int src,
                                           size_t line) {
  return base + a.ll128_offset +
         ((parity * N + static_cast<size_t>(src)) * a.ll128_lines + line) * kLL128LineBytes;
}

// Data of unit u (0..7) of LL128 line `line` of `data`: the line carries data
// bytes [120 line, 120 line + 120), i.e. 8-byte words 15 line .. 15 line + 14;
// unit u < 7 holds words 15 line + 2u and + 2u + 1, unit 7 word 15 line + 14
// (then the flag). Zero padded past the end.
template <typename T>
__device__ __forceinline__ uint4 LoadLL128Unit(const char* data, size_t line, int u, size_t count,
                                               bool aligned8) {
  const size_t w = 15 * line + 2 * static_cast<size_t>(u);
  const uint2 lo = LoadLine<T>(data, w, count, aligned8);
  const uint2 hi = u < 7 ? LoadLine<T>(data, w + 1, count, aligned8) : make_uint2(0, 0);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// Lines each thread keeps in flight per pass of the LL128 kernel (its units
// of K lines, kLL128Threads / 8 lines apart): loads, stores and polls of the K
// lines are issued together, so a block's K x 64 lines cost one round trip.
template <int N>
inline constexpr int kLL128Unroll = N <= 4 ? 2 : 1;

// This block's LL128 lines [begin, end) of a message of `count` elements:
// the lines are split evenly over the grid's blocks.
struct LineRange {
  size_t begin, end;
};
template <typename T>
__device__ __forceinline__ LineRange LL128BlockLines(size_t count) {
  const size_t lines = (count * sizeof(T) + kLL128DataBytes - 1) / kLL128DataBytes;
  const size_t per_block = (lines + gridDim.x - 1) / gridDim.x;
  const size_t l0 = min(lines, static_cast<size_t>(blockIdx.x) * per_block);
  return {l0, min(lines, l0 + per_block)};
}

// Waits until every peer's copy of this warp's lines carries epoch e in its
// flag, and gathers the units into in[k][src]. Lane group g = lane / 8 of the
// warp holds line[k] (one per k, active[k] when it exists), lane u = lane % 8
// its unit u. The flag sits in unit 7, the data in the same 128-byte line,
// written by one warp store instruction and read by one warp load
// instruction; NVLink and the L2 move such a line as a whole (the property
// NCCL's LL128 protocol rests on), so a line whose flag reads e has all of
// its data. Missing lines vote yes. Warp-uniform result: false after a
// timeout or abort (recorded once per warp).
template <int N, int K>
__device__ __forceinline__ bool LL128Receive(const DeviceArgs& a, size_t parity,
                                             const size_t (&line)[K], const bool (&active)[K],
                                             uint32_t e, int b, uint32_t (&in)[K][N][4]) {
  char* const my_base = BaseOf<N>(a, a.rank);
  const int lane = threadIdx.x & 31, u = lane & 7;
  SpinBound bound;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r == a.rank) continue;
    const char* slot[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      slot[k] = LL128Slot<N>(a, my_base, parity, r, active[k] ? line[k] : 0) + u * 16;
    }
    for (;;) {
      uint4 v[K];
      bool ok = true;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        v[k] = active[k] ? LdVolatileV4(slot[k]) : make_uint4(0, 0, e, e);
        ok = ok && (u != 7 || (v[k].z == e && v[k].w == e));
      }
      if (__all_sync(0xffffffffu, ok)) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
          in[k][r][0] = v[k].x, in[k][r][1] = v[k].y, in[k][r][2] = v[k].z, in[k][r][3] = v[k].w;
        }
        break;
      }
      const uint32_t err = bound.Check(a);
      const unsigned failed = __ballot_sync(0xffffffffu, err != kErrNone);
      if (failed != 0) {
        if (lane == __ffs(failed) - 1) RecordError<N>(a, err, r, kTagLL128, b, e);
        return false;
      }
    }
  }
  return true;
}

// LL128 sends of block blockIdx.x: the message's lines are split evenly over
// the grid's blocks, and each thread sends its units of K lines per pass
// (blockDim.x / 8 lines apart; loads in flight before the stores) to every
// peer as posted remote stores, the flag {e, e} in unit 7. The pass loop is
// uniform over the block, so the 8 lanes of a line store together.
template <typename T, int N, int K>
__device__ __forceinline__ void LL128Send(const DeviceArgs& a, const char* data, size_t count,
                                          bool aligned8, size_t parity, uint32_t e) {
  const auto [l0, l1] = LL128BlockLines<T>(count);
  const size_t lines_per_pass = blockDim.x / 8;
  const int u = threadIdx.x & 7;
  for (size_t pass = l0; pass < l1; pass += K * lines_per_pass) {
    size_t l[K];
    uint4 v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      l[k] = pass + k * lines_per_pass + (threadIdx.x >> 3);
      v[k] = l[k] < l1 ? LoadLL128Unit<T>(data, l[k], u, count, aligned8) : uint4{};
      if (u == 7) v[k].z = e, v[k].w = e;
    }
    __syncwarp();
#pragma unroll
    for (int p = 0; p < N; ++p) {
      if (p == a.rank) continue;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (l[k] < l1) {
          StVolatileV4(LL128Slot<N>(a, a.base[p], parity, a.rank, l[k]) + u * 16, v[k].x, v[k].y,
                       v[k].z, v[k].w);
        }
      }
    }
  }
}

// LL128: like LL (flags travel with the data, no fences, one one-way latency
// per call) with 120 data bytes in every 128-byte line instead of 8 in 16, so
// the mid sizes move 1.07x their bytes over NVLink instead of 2x. Each group
// of 8 lanes sends one line (unit u from lane u, the flag {e, e} in unit 7)
// with one 16-byte store per lane; the lanes of a warp store 4 whole lines
// together. Lines are split evenly over the blocks; the loops are uniform
// over the block, so the 8 lanes of a line always store and load together.
template <typename T, int N>
__global__ void __launch_bounds__(kLL128Threads, 2)
    LL128Kernel(DeviceArgs a, void* data_v, size_t count) {
  SYMTP_TRACE_KERNEL(kAllReduceLL128);
  internal::GridDependencyWait();  // launched with PDL: the previous kernel completes first
  constexpr int K = kLL128Unroll<N>;
  constexpr size_t kLinesPerPass = kLL128Threads / 8;
  char* const data = static_cast<char*>(data_v);
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int u = tid & 7;
  const int me = a.rank;
  char* const my_base = BaseOf<N>(a, me);
  const uint32_t e = reinterpret_cast<const uint32_t*>(my_base + kEpochLL128Offset)[b] + 1;
  const size_t parity = e & 1;

  const auto [l0, l1] = LL128BlockLines<T>(count);
  const bool aligned8 = (reinterpret_cast<uintptr_t>(data) & 7) == 0;

  // 1. Send this block's lines to every peer.
  LL128Send<T, N, K>(a, data, count, aligned8, parity, e);

  // 2. Receive (poll own memory) and reduce in rank order.
  for (size_t pass = l0; pass < l1; pass += K * kLinesPerPass) {
    size_t l[K];
    bool active[K];
    uint32_t in[K][N][4];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      l[k] = pass + k * kLinesPerPass + (tid >> 3);
      active[k] = l[k] < l1;
      const uint4 mine = active[k] ? LoadLL128Unit<T>(data, l[k], u, count, aligned8) : uint4{};
#pragma unroll
      for (int r = 0; r < N; ++r) {
        if (r == me)
          in[k][r][0] = mine.x, in[k][r][1] = mine.y, in[k][r][2] = mine.z, in[k][r][3] = mine.w;
      }
    }
    if (!LL128Receive<N, K>(a, parity, l, active, e, b, in)) break;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!active[k]) continue;
      uint32_t out[4];
      ReducePacked<T, N, 4>(in[k], out);
      const size_t w = 15 * l[k] + 2 * static_cast<size_t>(u);
      StoreLine<T>(data, w, count, aligned8, make_uint2(out[0], out[1]));
      if (u < 7) StoreLine<T>(data, w + 1, count, aligned8, make_uint2(out[2], out[3]));
    }
  }
  __syncthreads();
  if (tid == 0) reinterpret_cast<uint32_t*>(my_base + kEpochLL128Offset)[b] = e;
}

// ---------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------

template <typename T, int N>
cudaError_t LaunchTyped(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                        cudaStream_t stream) {
  switch (protocol) {
    case Protocol::kStaged:
      return internal::LaunchDependent(StagedKernel<T, N>, dim3(a.staged_blocks),
                                       dim3(kStagedThreads), 0, stream, a, data, count);
    case Protocol::kTwoShot:
      return internal::LaunchDependent(TwoShotKernel<T, N>, dim3(a.staged_blocks),
                                       dim3(kStagedThreads), 0, stream, a, data, count);
    case Protocol::kLL:
      return internal::LaunchDependent(LLKernel<T, N>, dim3(a.ll_blocks), dim3(kLLThreads), 0,
                                       stream, a, data, count);
    case Protocol::kLL128:
      return internal::LaunchDependent(LL128Kernel<T, N>, dim3(a.ll128_blocks), dim3(kLL128Threads),
                                       0, stream, a, data, count);
    case Protocol::kCopy:  // receive side of the copy exchange only (fused_norm_kernels.cuh)
      break;
  }
  return cudaErrorInvalidValue;
}

// f(std::integral_constant<int, N>{}) for the group size N = a.size (2, 4
// or 8): the kernels are instantiated per size.
template <typename F>
cudaError_t ForGroupSize(const DeviceArgs& a, F&& f) {
  switch (a.size) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t LaunchForSize(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                          cudaStream_t stream) {
  return ForGroupSize(a, [&](auto n) {
    return LaunchTyped<T, decltype(n)::value>(protocol, a, data, count, stream);
  });
}

}  // namespace symtp::kernels::allreduce_internal
