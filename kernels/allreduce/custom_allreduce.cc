#include "kernels/allreduce/custom_allreduce.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/allreduce/fused_norm_launch.h"

namespace symtp::kernels {
namespace {

using allreduce_internal::DeviceArgs;
using allreduce_internal::kMaxBlocks;
using allreduce_internal::kMaxRanks;

constexpr size_t kMinMaxBytes = 64 * 1024;
constexpr uint32_t kProbeWords = 2048;  // 8 KiB per (writer, reader) pair

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Host-mapped words the kernels write (error mirror) and read (abort).
struct HostWords {
  unsigned long long error;
  int abort;
};

// One rank's verdict on a set-up phase; exchanged so that all ranks agree.
struct Verdict {
  int32_t ok;
  int32_t code;
  char message[248];
};

Verdict MakeVerdict(const absl::Status& st) {
  Verdict v{};
  v.ok = st.ok() ? 1 : 0;
  v.code = static_cast<int32_t>(st.code());
  std::string msg(st.message());
  strncpy(v.message, msg.c_str(), sizeof(v.message) - 1);
  return v;
}

// Every rank's status for `phase`; the first failing rank's error on all.
absl::Status Agree(PeerExchange* ex, int size, const absl::Status& local, const char* phase,
                   Deadline deadline) {
  Verdict mine = MakeVerdict(local);
  std::vector<Verdict> all(size);
  SYMTP_RETURN_IF_ERROR_CTX(ex->AllGather(&mine, sizeof(mine), all.data(), deadline),
                            absl::StrCat("custom all-reduce ", phase, ": exchanging verdicts"));
  for (int r = 0; r < size; ++r) {
    if (!all[r].ok) {
      all[r].message[sizeof(all[r].message) - 1] = '\0';
      return absl::Status(static_cast<absl::StatusCode>(all[r].code),
                          absl::StrCat("custom all-reduce ", phase, ": rank ", r, ": ",
                                       all[r].message));
    }
  }
  return absl::OkStatus();
}

// What each rank publishes at start-up.
struct Hello {
  Verdict verdict;
  cudaIpcMemHandle_t handle;
  char bus_id[32];
  uint64_t total_bytes;
  uint64_t max_bytes;
  uint64_t ll_max_bytes;
  uint64_t fused_ll_max_bytes;
  uint64_t ll128_max_bytes;
  uint64_t two_shot_min_bytes;
  int64_t timeout_ms;
  int32_t staged_blocks;
  int32_t ll_blocks;
  int32_t ll128_blocks;
  uint64_t two_shot_pipeline_min_bytes;
  uint64_t two_shot_chunk_bytes;
  int32_t two_shot_scatter_blocks;
  int32_t two_shot_reduce_blocks;
  uint32_t initial_epoch;
  uint32_t nonce;
};

// The protocols' size limits, Options::kAuto resolved. Graph-timed on H100
// x2 and x4 (bench/results/h100x2/allreduce_ll128, h100x4/allreduce_ll128):
// at TP 2 LL128 beats LL from 64 KiB on (2.93 vs 3.13 us at 128 KiB) and
// STAGED at every larger size up to 4 MiB (5.63 vs 7.29 us at 1 MiB; 31.6
// vs 31.5 at 8 MiB). The fused LL128 kernel beats the fused LL one from one
// row of 4096 bf16 in isolation (3.29 vs 3.55 us), but the batch-1 step
// with it was 1.005x (a run's spread is about that: the same kernels
// measured 1.003x apart), so the fused LL keeps 1-2 rows (16 KiB), where no
// gain was shown, and LL128 takes over from 4 rows (3.43 vs 3.87 us). At
// TP 4 LL128 wins at 128-512 KiB but loses to STAGED from 1 MiB (16.9 vs
// 15.4 us: every rank pushes three copies and LL128 7% more bytes), and
// decode steps with it were no faster
// (0.995-1.05x), so TP 4 and TP 8 (unmeasured) keep LL up to 256 KiB / size,
// the fused LL up to 128 KiB (capped at that) and STAGED above, TWO-SHOT from
// 1 MiB: at TP 4 (H100 x4, graph-timed) it ties STAGED at 512 KiB (10.5 vs
// 10.3 us) and wins from 1 MiB (13.7 vs 15.7, 32.8 vs 45.2 at 4 MiB), and
// decode steps with 1-8 MiB all-reduces got 0.93-0.99x
// (bench/results/h100x4/allreduce_two_shot). At TP 2 it sends the same bytes
// as a one-shot, and LL128 carries every size.
struct Limits {
  size_t ll, fused_ll, ll128, two_shot_min;
};
Limits AutoLimits(int size, const CustomAllReduce::Options& o) {
  constexpr size_t kAuto = CustomAllReduce::Options::kAuto;
  constexpr size_t kCapacity = kAuto - 1;  // every size; Init caps it at max_bytes
  Limits l;
  l.ll128 = o.ll128_max_bytes != kAuto ? o.ll128_max_bytes : size == 2 ? kCapacity : 0;
  const bool with_ll128 = l.ll128 > 0;
  l.ll = o.ll_max_bytes != kAuto ? o.ll_max_bytes
         : with_ll128            ? size_t{64} << 10
                                 : (size_t{256} << 10) / static_cast<size_t>(size == 2 ? 1 : size);
  l.fused_ll = o.fused_ll_max_bytes != kAuto ? o.fused_ll_max_bytes
               : with_ll128                  ? size_t{16} << 10
                                             : size_t{128} << 10;
  l.two_shot_min = o.two_shot_min_bytes == 0      ? kAuto  // never
                   : o.two_shot_min_bytes != kAuto ? o.two_shot_min_bytes
                   : size >= 4                     ? size_t{1} << 20
                                                   : kAuto;
  return l;
}

// TWO-SHOT's schedule on a staged grid of `blocks` (>= 4), Options' zeros
// resolved: pipelined from 2 MiB, in chunks of 64 KiB, a quarter of the
// blocks scattering, a quarter reducing, the rest gathering. Graph-timed at
// TP 4 on H100 x4 (bench/results/h100x4/allreduce_two_shot_pipelined), the
// pipeline against one chunk per block: 18.3 vs 20.1 us at 2 MiB, 46.9 vs
// 58.1 at 8 MiB, and 14.7 vs 13.5 at 1 MiB (where each step's chunk is
// pushed by a quarter of the SMs); 32 or 128 KiB chunks and other splits of
// the grid were no better.
struct TwoShotShape {
  size_t pipeline_min_bytes, chunk_bytes;
  int scatter, reduce;
};
TwoShotShape AutoTwoShot(int blocks, const CustomAllReduce::Options& o) {
  TwoShotShape t;
  t.pipeline_min_bytes =
      o.two_shot_pipeline_min_bytes > 0 ? o.two_shot_pipeline_min_bytes : size_t{2} << 20;
  t.chunk_bytes = o.two_shot_chunk_bytes > 0 ? o.two_shot_chunk_bytes : size_t{64} << 10;
  t.scatter = o.two_shot_scatter_blocks > 0 ? o.two_shot_scatter_blocks : blocks / 4;
  t.reduce = o.two_shot_reduce_blocks > 0 ? o.two_shot_reduce_blocks : blocks / 4;
  return t;
}

// The protocol an error word's tag names ("?" for none).
const char* TagName(uint32_t tag) {
  switch (tag) {
    case allreduce_internal::kTagLL:
      return CustomAllReduce::ProtocolName(CustomAllReduce::Protocol::kLL);
    case allreduce_internal::kTagLL128:
      return CustomAllReduce::ProtocolName(CustomAllReduce::Protocol::kLL128);
    case allreduce_internal::kTagStaged:
      return CustomAllReduce::ProtocolName(CustomAllReduce::Protocol::kStaged);
    case allreduce_internal::kTagTwoShot:
      return CustomAllReduce::ProtocolName(CustomAllReduce::Protocol::kTwoShot);
    case allreduce_internal::kTagCopy:
      return CustomAllReduce::ProtocolName(CustomAllReduce::Protocol::kCopy);
  }
  return "?";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CustomAllReduce>> CustomAllReduce::Create(
    int rank, int size, int device, size_t max_bytes, PeerExchange* exchange, Deadline deadline) {
  return Create(rank, size, device, max_bytes, exchange, deadline, Options());
}

absl::StatusOr<std::unique_ptr<CustomAllReduce>> CustomAllReduce::Create(
    int rank, int size, int device, size_t max_bytes, PeerExchange* exchange, Deadline deadline,
    const Options& options) {
  if (exchange == nullptr) return absl::InvalidArgumentError("CustomAllReduce: no PeerExchange");
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("CustomAllReduce: rank ", rank, " of ", size));
  }
  if (size != 2 && size != 4 && size != 8) {
    // Same answer on every rank without an exchange.
    return absl::UnimplementedError(
        absl::StrCat("custom all-reduce supports TP 2, 4, 8; not ", size));
  }
  std::unique_ptr<CustomAllReduce> ar(new CustomAllReduce());
  SYMTP_RETURN_IF_ERROR(ar->Init(rank, size, device, max_bytes, exchange, deadline, options));
  return ar;
}

absl::Status CustomAllReduce::Init(int rank, int size, int device, size_t max_bytes,
                                   PeerExchange* exchange, Deadline deadline,
                                   const Options& options) {
  rank_ = rank;
  size_ = size;
  device_ = device;
  timeout_ms_ = options.timeout_ms;
  max_bytes_ = RoundUp(std::max(max_bytes, kMinMaxBytes), 256);
  const Limits limits = AutoLimits(size, options);
  ll_max_bytes_ = RoundUp(std::min(limits.ll, max_bytes_), 8);
  fused_ll_max_bytes_ = std::min(limits.fused_ll, ll_max_bytes_);
  two_shot_min_bytes_ = limits.two_shot_min;
  const size_t ll_lines = ll_max_bytes_ / 8;
  const size_t ll_offset = allreduce_internal::kSignalBytes;
  const size_t ll_bytes = 2 * static_cast<size_t>(size) * ll_lines * allreduce_internal::kLLLineBytes;
  ll128_max_bytes_ = RoundUp(std::min(limits.ll128, max_bytes_), 8);
  const size_t ll128_lines = (ll128_max_bytes_ + allreduce_internal::kLL128DataBytes - 1) /
                             allreduce_internal::kLL128DataBytes;
  const size_t ll128_offset = RoundUp(ll_offset + ll_bytes, 4096);
  const size_t ll128_bytes =
      2 * static_cast<size_t>(size) * ll128_lines * allreduce_internal::kLL128LineBytes;
  const size_t stage_offset = RoundUp(ll128_offset + ll128_bytes, 4096);
  const size_t copy_flags_offset =
      RoundUp(stage_offset + 2 * static_cast<size_t>(size - 1) * max_bytes_, 4096);
  copy_bytes_ = RoundUp(options.copy_bytes, 256);
  const size_t copy_flags_bytes =
      copy_bytes_ > 0 ? allreduce_internal::kCopyFlags * allreduce_internal::kMaxRanks * 4 : 0;
  const size_t copy_offset = RoundUp(copy_flags_offset + copy_flags_bytes, 4096);
  total_bytes_ = copy_offset + 2 * static_cast<size_t>(size - 1) * copy_bytes_;

  // Phase 1 (local): allocate, initialise, export.
  Hello hello{};
  const TwoShotShape two_shot = AutoTwoShot(options.staged_blocks, options);
  auto local = [&]() -> absl::Status {
    auto bad_grid = [](int blocks) { return blocks < 1 || blocks > kMaxBlocks; };
    if (options.staged_blocks < 4 || bad_grid(options.staged_blocks) ||
        bad_grid(options.ll_blocks) || bad_grid(options.ll128_blocks) || options.timeout_ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad options: staged_blocks ", options.staged_blocks, " (4..", kMaxBlocks,
                       "), ll_blocks ", options.ll_blocks, ", ll128_blocks ", options.ll128_blocks,
                       " (1..", kMaxBlocks, "), timeout_ms ", options.timeout_ms));
    }
    if (two_shot.scatter < 1 || two_shot.reduce < 1 ||
        two_shot.scatter + two_shot.reduce >= options.staged_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad options: two-shot scatter blocks ", two_shot.scatter, " and reduce blocks ",
          two_shot.reduce, " (at least 1 each, leaving at least one of the ", options.staged_blocks,
          " staged blocks to gather)"));
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer_, total_bytes_));
    // Signals and LL lines start at the initial epoch: flags and lines then
    // read "older than the first call" however close to 2^32 it is.
    std::vector<uint32_t> image(stage_offset / 4, 0);
    const uint32_t e0 = options.initial_epoch;
    for (size_t i = 0; i < kMaxBlocks * kMaxRanks; ++i) {
      image[allreduce_internal::kFlagsOffset / 4 + i] = e0;
      image[allreduce_internal::kScatterFlagsOffset / 4 + i] = e0;
    }
    image[allreduce_internal::kCopyEpochOffset / 4] = e0;
    for (size_t i = 0; i < kMaxBlocks; ++i) {
      image[allreduce_internal::kEpochStagedOffset / 4 + i] = e0;
      image[allreduce_internal::kEpochLLOffset / 4 + i] = e0;
      image[allreduce_internal::kEpochLL128Offset / 4 + i] = e0;
    }
    for (size_t w = ll_offset / 4; w < (ll_offset + ll_bytes) / 4; w += 4) {
      image[w + 1] = e0;
      image[w + 3] = e0;
    }
    constexpr size_t kLineWords = allreduce_internal::kLL128LineBytes / 4;
    for (size_t w = ll128_offset / 4; w < (ll128_offset + ll128_bytes) / 4; w += kLineWords) {
      image[w + kLineWords - 2] = e0;  // the flag: the last 8 bytes of each line
      image[w + kLineWords - 1] = e0;
    }
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(buffer_, image.data(), image.size() * 4, cudaMemcpyHostToDevice));
    if (copy_flags_bytes > 0) {  // the copy exchange's flags hold the initial epoch
      const std::vector<uint32_t> flags(copy_flags_bytes / 4, e0);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer_ + copy_flags_offset, flags.data(), copy_flags_bytes,
                                      cudaMemcpyHostToDevice));
    }
    void* host = nullptr;
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, sizeof(HostWords), cudaHostAllocMapped));
    memset(host, 0, sizeof(HostWords));
    error_host_ = &static_cast<HostWords*>(host)->error;
    abort_host_ = &static_cast<HostWords*>(host)->abort;
    CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&hello.handle, buffer_));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(hello.bus_id, sizeof(hello.bus_id), device));
    return absl::OkStatus();
  }();
  hello.verdict = MakeVerdict(local);
  hello.total_bytes = total_bytes_;
  hello.max_bytes = max_bytes_;
  hello.ll_max_bytes = ll_max_bytes_;
  hello.fused_ll_max_bytes = fused_ll_max_bytes_;
  hello.ll128_max_bytes = ll128_max_bytes_;
  hello.two_shot_min_bytes = two_shot_min_bytes_;
  hello.timeout_ms = options.timeout_ms;
  hello.staged_blocks = options.staged_blocks;
  hello.ll_blocks = options.ll_blocks;
  hello.ll128_blocks = options.ll128_blocks;
  hello.two_shot_pipeline_min_bytes = two_shot.pipeline_min_bytes;
  hello.two_shot_chunk_bytes = two_shot.chunk_bytes;
  hello.two_shot_scatter_blocks = two_shot.scatter;
  hello.two_shot_reduce_blocks = two_shot.reduce;
  hello.initial_epoch = options.initial_epoch;
  hello.nonce = static_cast<uint32_t>(MonotonicNs() ^ (static_cast<int64_t>(getpid()) << 20));

  std::vector<Hello> hellos(size);
  SYMTP_RETURN_IF_ERROR_CTX(exchange->AllGather(&hello, sizeof(hello), hellos.data(), deadline),
                            "custom all-reduce: exchanging IPC handles");
  for (int r = 0; r < size; ++r) {
    const Hello& h = hellos[r];
    if (!h.verdict.ok) {
      return absl::Status(static_cast<absl::StatusCode>(h.verdict.code),
                          absl::StrCat("custom all-reduce set-up: rank ", r, ": ",
                                       std::string(h.verdict.message,
                                                   strnlen(h.verdict.message,
                                                           sizeof(h.verdict.message)))));
    }
    if (h.total_bytes != hellos[0].total_bytes || h.max_bytes != hellos[0].max_bytes ||
        h.ll_max_bytes != hellos[0].ll_max_bytes ||
        h.fused_ll_max_bytes != hellos[0].fused_ll_max_bytes ||
        h.ll128_max_bytes != hellos[0].ll128_max_bytes ||
        h.two_shot_min_bytes != hellos[0].two_shot_min_bytes ||
        h.timeout_ms != hellos[0].timeout_ms || h.staged_blocks != hellos[0].staged_blocks ||
        h.ll_blocks != hellos[0].ll_blocks || h.ll128_blocks != hellos[0].ll128_blocks ||
        h.two_shot_pipeline_min_bytes != hellos[0].two_shot_pipeline_min_bytes ||
        h.two_shot_chunk_bytes != hellos[0].two_shot_chunk_bytes ||
        h.two_shot_scatter_blocks != hellos[0].two_shot_scatter_blocks ||
        h.two_shot_reduce_blocks != hellos[0].two_shot_reduce_blocks ||
        h.initial_epoch != hellos[0].initial_epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "custom all-reduce set-up: rank ", r, " was created with other sizes/options than rank 0 "
          "(max_bytes ", h.max_bytes, " vs ", hellos[0].max_bytes, ", ll_max_bytes ",
          h.ll_max_bytes, " vs ", hellos[0].ll_max_bytes, ")"));
    }
  }

  // Phase 2 (local): check peer access, open the peers' buffers.
  local = [&]() -> absl::Status {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      int peer_dev = -1;
      if (cudaDeviceGetByPCIBusId(&peer_dev, hellos[r].bus_id) != cudaSuccess) {
        cudaGetLastError();  // not visible here: the IPC open + probe decide
        peer_dev = -1;
      }
      if (peer_dev >= 0 && peer_dev != device) {
        int can = 0;
        CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, peer_dev));
        if (!can) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cudaDeviceCanAccessPeer: device ", device, " cannot access rank ", r,
              "'s device ", peer_dev, " (", hellos[r].bus_id, ")"));
        }
      }
      void* p = nullptr;
      CUDA_RETURN_IF_ERROR(
          cudaIpcOpenMemHandle(&p, hellos[r].handle, cudaIpcMemLazyEnablePeerAccess));
      peers_[r] = static_cast<char*>(p);
    }
    return absl::OkStatus();
  }();
  SYMTP_RETURN_IF_ERROR(Agree(exchange, size, local, "opening peer buffers", deadline));

  args_ = DeviceArgs{};
  for (int r = 0; r < size; ++r) args_.base[r] = r == rank ? buffer_ : peers_[r];
  void* dev_ptr = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev_ptr, error_host_, 0));
  args_.error_host = static_cast<unsigned long long*>(dev_ptr);
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev_ptr, abort_host_, 0));
  args_.abort_word = static_cast<const volatile int*>(dev_ptr);
  args_.abort_mirror =
      reinterpret_cast<unsigned int*>(buffer_ + allreduce_internal::kAbortMirrorOffset);
  args_.timeout_ns = static_cast<uint64_t>(options.timeout_ms) * 1'000'000;
  args_.ll_offset = ll_offset;
  args_.ll_lines = ll_lines;
  args_.stage_offset = stage_offset;
  args_.stage_bytes = max_bytes_;
  args_.ll128_offset = ll128_offset;
  args_.ll128_lines = ll128_lines;
  args_.ll128_blocks = options.ll128_blocks;
  args_.rank = rank;
  args_.size = size;
  args_.staged_blocks = options.staged_blocks;
  args_.ll_blocks = options.ll_blocks;
  args_.two_shot_pipeline_min_bytes = two_shot.pipeline_min_bytes;
  args_.two_shot_chunk_bytes = two_shot.chunk_bytes;
  args_.two_shot_scatter_blocks = two_shot.scatter;
  args_.two_shot_reduce_blocks = two_shot.reduce;
  args_.copy_flags_offset = copy_flags_offset;
  args_.copy_offset = copy_offset;
  args_.copy_bytes = copy_bytes_;

  // Phase 3: write-and-verify probe through the mappings.
  SYMTP_RETURN_IF_ERROR(Probe(exchange, deadline, hellos[0].nonce));
  SYMTP_LOG(DEBUG, "allreduce") << "custom all-reduce ready: rank " << rank << "/" << size
                                << " device " << device << ", max " << max_bytes_ << " B, LL up to "
                                << ll_max_bytes_ << " B, LL128 up to " << ll128_max_bytes_
                                << " B, scratch " << total_bytes_ << " B";
  return absl::OkStatus();
}

absl::Status CustomAllReduce::Probe(PeerExchange* exchange, Deadline deadline, uint32_t nonce) {
  cuda::Stream stream;
  cuda::DeviceBuffer counts;
  absl::Status local = [&]() -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(stream, cuda::Stream::Create());
    SYMTP_ASSIGN_OR_RETURN(counts, cuda::DeviceBuffer::Create(2 * kMaxRanks * sizeof(int)));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts.get(), 0, counts.bytes(), stream.get()));
    CUDA_RETURN_IF_ERROR(
        allreduce_internal::LaunchProbeWrite(args_, kProbeWords, nonce, stream.get()));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
    return absl::OkStatus();
  }();
  SYMTP_RETURN_IF_ERROR(Agree(exchange, size_, local, "P2P probe (write)", deadline));
  local = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(allreduce_internal::LaunchProbeVerify(args_, kProbeWords, nonce,
                                                               counts.as<int>(), stream.get()));
    int host[2 * kMaxRanks] = {};
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, counts.get(), sizeof(host), cudaMemcpyDeviceToHost, stream.get()));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
    for (int s = 0; s < size_; ++s) {
      if (host[s] != 0 || host[kMaxRanks + s] != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "P2P probe with rank ", s, ": ", host[s], " of ", kProbeWords,
            " words written by rank ", s, " arrived wrong here, ", host[kMaxRanks + s],
            " words written here read back wrong through the mapping"));
      }
    }
    return absl::OkStatus();
  }();
  return Agree(exchange, size_, local, "P2P probe (verify)", deadline);
}

CustomAllReduce::~CustomAllReduce() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  for (int r = 0; r < kMaxRanks; ++r) {
    if (peers_[r] != nullptr && cudaIpcCloseMemHandle(peers_[r]) != cudaSuccess) {
      SYMTP_LOG(WARN, "allreduce") << "cudaIpcCloseMemHandle(rank " << r << ") failed";
    }
  }
  if (buffer_ != nullptr) cudaFree(buffer_);
  if (error_host_ != nullptr) cudaFreeHost(error_host_);  // HostWords starts with `error`
  cudaGetLastError();
  if (prev >= 0) cudaSetDevice(prev);
}

absl::Status CustomAllReduce::Poll() {
  const unsigned long long word =
      error_host_ == nullptr ? 0 : __atomic_load_n(error_host_, __ATOMIC_ACQUIRE);
  if (word != 0) {
    const uint32_t code = static_cast<uint32_t>(word >> 56);
    const uint32_t peer = static_cast<uint32_t>(word >> 48) & 0xff;
    const uint32_t proto = static_cast<uint32_t>(word >> 40) & 0xff;
    const uint32_t block = static_cast<uint32_t>(word >> 32) & 0xff;
    const uint32_t epoch = static_cast<uint32_t>(word);
    if (code == allreduce_internal::kErrTimeout) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "custom all-reduce on rank %d/%d (device %d): rank %u never arrived: waited %d ms in "
          "the %s protocol (block %u, call epoch %u); the peer is dead, hung, or not issuing the "
          "same sequence of all-reduces",
          rank_, size_, device_, peer, timeout_ms_, TagName(proto), block, epoch));
    }
    return absl::AbortedError(absl::StrFormat(
        "custom all-reduce on rank %d/%d: aborted while waiting for rank %u (%s protocol, block "
        "%u, call epoch %u)",
        rank_, size_, peer, TagName(proto), block, epoch));
  }
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::AbortedError(absl::StrCat("custom all-reduce on rank ", rank_, "/", size_,
                                           ": aborted"));
  }
  return absl::OkStatus();
}

void CustomAllReduce::Abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  if (abort_host_ != nullptr) __atomic_store_n(abort_host_, 1, __ATOMIC_RELEASE);
  SYMTP_LOG(INFO, "allreduce") << "custom all-reduce aborted on rank " << rank_;
}

absl::Status CustomAllReduce::Sticky() { return Poll(); }

absl::Status CustomAllReduce::AllReduceSum(void* data, size_t count, DType dtype,
                                           cudaStream_t stream) {
  return AllReduceSumWith(ProtocolFor(count * DTypeSize(dtype)), data, count, dtype, stream);
}

std::string CustomAllReduce::TwoShotLimitName() const {
  return two_shot_min_bytes_ == ~size_t{0} ? std::string("never")
                                           : absl::StrCat("from ", two_shot_min_bytes_, " B");
}

const char* CustomAllReduce::ProtocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::kLL:
      return "LL";
    case Protocol::kLL128:
      return "LL128";
    case Protocol::kStaged:
      return "staged";
    case Protocol::kTwoShot:
      return "two-shot";
    case Protocol::kCopy:
      return "copy";
  }
  return "?";
}

CustomAllReduce::Protocol CustomAllReduce::ProtocolUpTo(size_t bytes, size_t ll_limit) const {
  if (bytes <= ll_limit) return Protocol::kLL;
  return bytes <= ll128_max_bytes_ ? Protocol::kLL128 : Protocol::kStaged;
}

CustomAllReduce::Protocol CustomAllReduce::ProtocolFor(size_t bytes) const {
  const Protocol p = ProtocolUpTo(bytes, ll_max_bytes_);
  return p == Protocol::kStaged && bytes >= two_shot_min_bytes_ ? Protocol::kTwoShot : p;
}

CustomAllReduce::Protocol CustomAllReduce::FusedProtocolFor(size_t bytes) const {
  return ProtocolUpTo(bytes, fused_ll_max_bytes_);
}

absl::Status CustomAllReduce::AllReduceSumWith(Protocol protocol, void* data, size_t count,
                                               DType dtype, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR(Sticky());
  if (count == 0) return absl::OkStatus();
  const size_t esize = DTypeSize(dtype);
  const size_t bytes = count * esize;
  if (data == nullptr || reinterpret_cast<uintptr_t>(data) % esize != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("custom all-reduce: data pointer ", reinterpret_cast<uintptr_t>(data),
                     " is null or not aligned to its ", esize, "-byte elements"));
  }
  const size_t limit = protocol == Protocol::kLL      ? ll_max_bytes_
                       : protocol == Protocol::kLL128 ? ll128_max_bytes_
                                                      : max_bytes_;
  if (bytes > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom all-reduce: ", bytes, " bytes exceed the ",
        protocol == Protocol::kStaged || protocol == Protocol::kTwoShot
            ? ""
            : absl::StrCat(ProtocolName(protocol), " "),
        "limit of ",
        limit, " bytes"));
  }
  CUDA_RETURN_IF_ERROR(
      allreduce_internal::LaunchAllReduce(protocol, args_, data, count, dtype, stream));
  return absl::OkStatus();
}

namespace {
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The shapes every fused residual + RMSNorm kernel (fused_norm_kernels.cuh)
// takes: f32 / bf16, rows of whole 16-byte units (at most kFusedMaxUnits),
// 16-byte aligned residual, weight and output.
bool NormShapeFits(const ResidualNorm& norm, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) return false;
  const size_t unit_elems = 16 / DTypeSize(dtype);
  return norm.rows >= 0 && norm.hidden > 0 && norm.hidden % unit_elems == 0 &&
         norm.hidden / unit_elems <= static_cast<size_t>(allreduce_internal::kFusedMaxUnits) &&
         Aligned16(norm.residual) && Aligned16(norm.weight) && Aligned16(norm.out);
}
}  // namespace

bool CustomAllReduce::FusesResidualNorm(const ResidualNorm& norm, DType dtype) const {
  if (!NormShapeFits(norm, dtype)) return false;
  const size_t bytes = static_cast<size_t>(norm.rows) * norm.hidden * DTypeSize(dtype);
  // Where the plain all-reduce is two-shot, it and AddRmsNorm run instead of
  // the one-shot fused kernel.
  return bytes <= max_bytes_ && ProtocolFor(bytes) != Protocol::kTwoShot;
}

absl::Status CustomAllReduce::AllReduceResidualNorm(const void* data, const ResidualNorm& norm,
                                                    DType dtype, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR(Sticky());
  if (!FusesResidualNorm(norm, dtype) || !Aligned16(data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom all-reduce + RMSNorm: cannot fuse rows=", norm.rows, " hidden=", norm.hidden,
        " dtype=", DTypeName(dtype), " (f32/bf16, 16-byte rows and pointers, at most ",
        max_bytes_, " bytes)"));
  }
  if (norm.pushed && !PushFits(norm, dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom all-reduce + RMSNorm: rows=", norm.rows, " hidden=", norm.hidden, " ",
        DTypeName(dtype), " marked as pushed by its producer, which this shape does not allow"));
  }
  if (norm.rows == 0) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(norm.rows) * norm.hidden * DTypeSize(dtype);
  const allreduce_internal::FusedNormArgs f{data,      norm.residual, norm.weight, norm.out,
                                            norm.rows, norm.hidden,   norm.eps,    norm.pushed};
  CUDA_RETURN_IF_ERROR(allreduce_internal::LaunchFusedNorm(
      norm.pushed ? Protocol::kLL : FusedProtocolFor(bytes), args_, f, dtype, stream));
  return absl::OkStatus();
}

static_assert(allreduce_internal::kCopyFlags == kCopyExchangeFlags);

absl::Status CustomAllReduce::CopyBeginStep(cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR(Sticky());
  if (copy_bytes_ == 0) {
    return absl::FailedPreconditionError("custom all-reduce: created without a copy exchange");
  }
  CUDA_RETURN_IF_ERROR(allreduce_internal::LaunchCopyBeginStep(args_, stream));
  return absl::OkStatus();
}

absl::Status CustomAllReduce::CheckCopy(size_t offset_bytes, size_t bytes, int op, int flag) const {
  if (copy_bytes_ == 0 || op < 0 || op > 1 || flag < 0 ||
      flag >= allreduce_internal::kCopyFlags || offset_bytes % 16 != 0 ||
      offset_bytes + bytes > copy_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy exchange: op ", op, ", flag ", flag, " (< ", allreduce_internal::kCopyFlags,
        "), bytes [", offset_bytes, ", ", offset_bytes + bytes, ") of a capacity of ", copy_bytes_,
        " (16-byte aligned offset)"));
  }
  return absl::OkStatus();
}

absl::Status CustomAllReduce::CopySend(const void* data, size_t offset_bytes, size_t bytes, int op,
                                       int flag, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR(Sticky());
  SYMTP_RETURN_IF_ERROR(CheckCopy(offset_bytes, bytes, op, flag));
  const char* epoch = buffer_ + allreduce_internal::kCopyEpochOffset;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    char* dst = peers_[p] + allreduce_internal::CopySlotOffset(args_, op, p, rank_) + offset_bytes;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  // The flags after all the data: in stream order, each copy completes
  // (its writes performed at the peer) before the next starts.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    char* dst = peers_[p] + allreduce_internal::CopyFlagOffset(args_, flag, rank_);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, epoch, 4, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status CustomAllReduce::CopyReceiveResidualNorm(const void* data, int64_t row0, int op,
                                                      int flag, const ResidualNorm& norm,
                                                      DType dtype, cudaStream_t stream) {
  SYMTP_RETURN_IF_ERROR(Sticky());
  const size_t row_bytes = static_cast<size_t>(norm.hidden) * DTypeSize(dtype);
  SYMTP_RETURN_IF_ERROR(
      CheckCopy(static_cast<size_t>(row0) * row_bytes, norm.rows * row_bytes, op, flag));
  if (!NormShapeFits(norm, dtype) || norm.pushed || !Aligned16(data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy exchange + RMSNorm: cannot run rows=", norm.rows, " hidden=", norm.hidden,
        " dtype=", DTypeName(dtype), " (f32/bf16, 16-byte rows and pointers)"));
  }
  if (norm.rows == 0) return absl::OkStatus();
  allreduce_internal::FusedNormArgs f{data,      norm.residual, norm.weight, norm.out,
                                      norm.rows, norm.hidden,   norm.eps,    false};
  f.copy_op = op;
  f.copy_flag = flag;
  f.copy_row0 = row0;
  CUDA_RETURN_IF_ERROR(
      allreduce_internal::LaunchFusedNorm(Protocol::kCopy, args_, f, dtype, stream));
  return absl::OkStatus();
}

bool CustomAllReduce::PushFits(const ResidualNorm& norm, DType dtype) const {
  const size_t bytes = static_cast<size_t>(norm.rows) * norm.hidden * DTypeSize(dtype);
  return dtype == DType::kBF16 && args_.size >= 2 && args_.size <= LLPush::kMaxRanks &&
         bytes <= ll_max_bytes_ && FusesResidualNorm(norm, dtype);
}

bool CustomAllReduce::ProducerPush(const ResidualNorm& norm, DType dtype, LLPush* push) const {
  if (!PushFits(norm, dtype)) return false;
  *push = LLPush{};
  for (int r = 0; r < args_.size; ++r) push->dst[r] = args_.base[r] + args_.ll_offset;
  push->epoch = reinterpret_cast<const uint32_t*>(args_.base[args_.rank] +
                                                  allreduce_internal::kEpochLLOffset);
  push->lines = args_.ll_lines;
  push->rank = args_.rank;
  push->size = args_.size;
  return true;
}

namespace allreduce_internal {

cudaError_t LaunchFusedNorm(Protocol protocol, const DeviceArgs& a, const FusedNormArgs& f,
                            DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32: return LaunchFusedNormF32(protocol, a, f, stream);
    case DType::kBF16: return LaunchFusedNormBF16(protocol, a, f, stream);
    case DType::kF16: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAllReduce(Protocol protocol, const DeviceArgs& a, void* data, size_t count,
                            DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      return LaunchAllReduceF32(protocol, a, data, count, stream);
    case DType::kBF16:
      return LaunchAllReduceBF16(protocol, a, data, count, stream);
    case DType::kF16:
      return LaunchAllReduceF16(protocol, a, data, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace allreduce_internal
}  // namespace symtp::kernels
