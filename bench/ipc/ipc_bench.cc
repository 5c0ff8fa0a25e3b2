// ipc_bench: the SPMC ring between processes.
//
// BM_Latency/consumers:N/bytes:S
//   One record in flight. The producer takes t0 = CLOCK_MONOTONIC, writes it
//   into the payload and publishes (Reserve + fill + Commit); each of N
//   consumer *processes* busy-polls (BusyPollPolicy), reads the record (a copy
//   out of the ring) and stores its completion time in its own cache line of a
//   shared "done" array. latency = max over consumers of completion - t0. The
//   next record is published when every consumer is done. Reported: p50, p99,
//   mean and max in microseconds (the benchmark's own time is the mean).
//
// BM_LatencyZeroCopy/consumers:N/bytes:S
//   The same, but each consumer reads the record in place (Peek, check its
//   first and last word, Release) instead of copying it out: how the
//   workers read a diff (they decode it straight from the ring).
//
// BM_PeerCheck/proc, BM_PeerCheck/pidfd
//   The cost of one periodic liveness check of a live peer, as a waiting
//   consumer makes it every sleep slice (2 ms): the /proc probe vs the pidfd
//   poll the consumers use between deadlines (PidWatch).
//
// BM_Stream/consumers:N/bytes:S
//   The producer publishes M records back to back (backpressure from the
//   ring, 1 MiB); consumers read with the default wait policy (spin -> yield
//   -> futex). Time runs from the first publish until the last consumer has
//   read the last record. Reported: records/s and payload MiB/s.
//
// Flags (besides Google Benchmark's own, e.g. --benchmark_format=json,
// --benchmark_out=FILE --benchmark_out_format=json, --benchmark_filter=RE):
//   --ipc_quick                 a few records per case (CI smoke)
//   --ipc_pin                   latency cases: pin the producer and each consumer
//                               to its own CPU (distinct physical cores first)
//   --ipc_demote                latency cases: the producer demotes each record's
//                               lines to L3 on commit (RingProducer::set_demote_on_commit)
//   --ipc_latency_records=N     records per latency case (default: by N)
//   --ipc_stream_records=N      records per stream case (default: by size)
//
// On a 2-core machine the cases with more consumer processes than cores
// measure the OS scheduler, not the ring: busy-polling consumers time-share.
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "ipc/liveness.h"
#include "ipc/ring.h"
#include "ipc/shm_segment.h"

ABSL_FLAG(bool, ipc_quick, false, "a few records per case (CI smoke)");
ABSL_FLAG(bool, ipc_pin, false, "latency cases: producer and each consumer on its own CPU");
ABSL_FLAG(bool, ipc_demote, false, "latency cases: the producer demotes each record's lines to L3");
ABSL_FLAG(int64_t, ipc_latency_records, 0, "records per latency case (0: by consumer count)");
ABSL_FLAG(int64_t, ipc_stream_records, 0, "records per stream case (0: by record size)");

namespace symtp::ipc {
namespace {

struct Options {
  bool quick = false;
  bool pin = false;  // --ipc_pin: producer and latency consumers on distinct cores
  bool demote = false;  // --ipc_demote: the latency producer CLDEMOTEs each record
  int64_t latency_records = 0;  // 0: default by consumer count
  int64_t stream_records = 0;   // 0: default by record size
};
Options g_options;  // from the flags, in main

constexpr uint64_t kRingCapacity = 1 << 20;

// One per consumer, in shared memory.
struct alignas(64) DoneSlot {
  std::atomic<uint64_t> seq;     // last seq fully consumed
  std::atomic<int64_t> done_ns;  // MonotonicNs() when it was consumed
  std::atomic<uint32_t> ready;   // attached and polling
  std::atomic<uint32_t> failed;  // the child hit an error (details on stderr)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Forked consumer processes; killed and reaped on every exit path.
class Children {
 public:
  ~Children() { KillAll(); }
  bool Spawn(const std::function<int()>& body) {
    const pid_t parent = ::getpid();
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(97);
      ::_exit(body());
    }
    pids_.push_back(pid);
    return true;
  }
  // Waits for every child to exit; false if one failed or the deadline passed.
  bool WaitAll(Deadline deadline) {
    bool ok = true;
    for (pid_t& pid : pids_) {
      while (pid > 0) {
        int st = 0;
        pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) {
          ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
          pid = -1;
        } else if (deadline.Expired()) {
          return false;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    }
    return ok;
  }
  void KillAll() {
    for (pid_t& pid : pids_) {
      if (pid <= 0) continue;
      ::kill(pid, SIGKILL);
      int st;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      pid = -1;
    }
  }

 private:
  std::vector<pid_t> pids_;
};

// A job segment with a ring and the done slots.
struct BenchJob {
  ShmSegment seg;
  SpmcRing ring;
  DoneSlot* done;
};

absl::StatusOr<BenchJob> MakeJob(uint32_t consumers) {
  RingConfig cfg{consumers, kRingCapacity};
  const size_t ring_bytes = SpmcRing::RequiredBytes(cfg);
  const size_t done_bytes = sizeof(DoneSlot) * kMaxRingConsumers;
  absl::StatusOr<ShmSegment> seg =
      ShmSegment::Create(ShmSegment::NewJobName(), ShmSegment::RegionFootprint(ring_bytes) +
                                                       ShmSegment::RegionFootprint(done_bytes));
  if (!seg.ok()) return seg.status();
  absl::StatusOr<void*> ring_mem = seg->Allocate("ring", ring_bytes);
  if (!ring_mem.ok()) return ring_mem.status();
  absl::StatusOr<void*> done_mem = seg->Allocate("done", done_bytes);
  if (!done_mem.ok()) return done_mem.status();
  absl::StatusOr<SpmcRing> ring = SpmcRing::Format(*ring_mem, ring_bytes, cfg);
  if (!ring.ok()) return ring.status();
  auto* done = static_cast<DoneSlot*>(*done_mem);
  for (uint32_t i = 0; i < kMaxRingConsumers; ++i) new (&done[i]) DoneSlot();
  return BenchJob{std::move(*seg), *ring, done};
}

// The CPUs this process may run on, in pinning order: the producer's CPU
// (the first allowed one), then one CPU per physical core sharing its L3
// (cache/index3/id), then one per core behind other L3s (on chiplet CPUs a
// consumer there reads the record across the fabric), then the remaining
// hyperthreads, nearest L3 first.
std::vector<int> PinOrder() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  auto read_int = [](const std::string& path) {
    int v = -1;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      if (std::fscanf(f, "%d", &v) != 1) v = -1;
      std::fclose(f);
    }
    return v;
  };
  struct Cpu {
    int cpu, package, core, l3;
  };
  std::vector<Cpu> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/";
    cpus.push_back({cpu, read_int(dir + "topology/physical_package_id"),
                    read_int(dir + "topology/core_id"), read_int(dir + "cache/index3/id")});
  }
  if (cpus.empty()) return {};
  const int home_l3 = cpus[0].l3;
  std::vector<std::pair<int, int>> seen_cores;  // (package, core)
  std::vector<std::pair<int, int>> keyed;       // (rank, cpu)
  for (const Cpu& c : cpus) {
    const std::pair<int, int> core{c.package, c.core};
    const bool sibling = c.core >= 0 &&
                         std::find(seen_cores.begin(), seen_cores.end(), core) != seen_cores.end();
    seen_cores.push_back(core);
    const bool far = c.l3 != home_l3;
    keyed.push_back({(sibling ? 2 : 0) + (far ? 1 : 0), c.cpu});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int> order;
  for (const auto& k : keyed) order.push_back(k.second);
  return order;
}

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

// Consumer process body: read until the ring is closed. `last_seq` > 0 marks
// the stream's last record (its completion time is what the stream case needs).
int ConsumerMain(SpmcRing ring, uint32_t index, DoneSlot* slot, WaitPolicy policy,
                 uint64_t last_seq, bool zero_copy = false) {
  auto c = RingConsumer::Attach(ring, index, "bench consumer " + std::to_string(index), policy);
  if (!c.ok()) {
    std::fprintf(stderr, "consumer %u: %s\n", index, c.status().ToString().c_str());
    slot->failed.store(1);
    return 1;
  }
  std::vector<uint8_t> buf;
  buf.reserve(1 << 17);
  slot->ready.store(1, std::memory_order_release);
  while (true) {
    absl::StatusOr<uint64_t> seq;
    if (zero_copy) {
      // Peek, check the record in place (first and last word), release.
      absl::StatusOr<RecordView> v = c->Peek(Deadline::AfterMs(120'000));
      if (v.ok()) {
        uint64_t first = 0, last = 0;
        std::memcpy(&first, v->payload.data(), sizeof(first));
        std::memcpy(&last, v->payload.data() + v->payload.size() - sizeof(last), sizeof(last));
        if (first == 0 || last == 0) slot->failed.store(1);
        const uint64_t s = v->seq;
        absl::Status r = c->Release();
        seq = r.ok() ? absl::StatusOr<uint64_t>(s) : absl::StatusOr<uint64_t>(r);
      } else {
        seq = v.status();
      }
    } else {
      seq = c->Read(&buf, Deadline::AfterMs(120'000));
    }
    if (seq.status().code() == absl::StatusCode::kOutOfRange) return 0;
    if (!seq.ok()) {
      std::fprintf(stderr, "consumer %u: %s\n", index, seq.status().ToString().c_str());
      slot->failed.store(1);
      return 1;
    }
    if (last_seq == 0 || *seq == last_seq) {
      slot->done_ns.store(MonotonicNs(), std::memory_order_relaxed);
      slot->seq.store(*seq, std::memory_order_release);
    }
  }
}

// Spins (then yields: on small machines the consumers need the core) until
// every consumer reports `seq`. Returns the latest completion time, or -1 on
// failure/timeout.
int64_t WaitAllDone(const DoneSlot* done, uint32_t n, uint64_t seq, Deadline deadline) {
  int64_t latest = 0;
  for (uint32_t i = 0; i < n; ++i) {
    int spins = 0;
    while (done[i].seq.load(std::memory_order_acquire) < seq) {
      if (done[i].failed.load(std::memory_order_relaxed)) return -1;
      if (++spins < 2000) {
        CpuRelax();
      } else {
        ::sched_yield();
        if ((spins & 255) == 0 && deadline.Expired()) return -1;
      }
    }
    latest = std::max(latest, done[i].done_ns.load(std::memory_order_relaxed));
  }
  return latest;
}

bool WaitAllReady(const DoneSlot* done, uint32_t n, Deadline deadline) {
  for (uint32_t i = 0; i < n; ++i) {
    while (done[i].ready.load(std::memory_order_acquire) == 0) {
      if (done[i].failed.load() || deadline.Expired()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return true;
}

int64_t LatencyRecords(uint32_t consumers) {
  if (g_options.latency_records > 0) return g_options.latency_records;
  if (g_options.quick) return 100;
  // Enough samples for a p99 where every process has its own core; few where
  // busy-polling consumers must time-share cores (that measures the OS).
  if (std::thread::hardware_concurrency() > consumers + 1) return 20'000;
  switch (consumers) {
    case 1:
      return 20'000;
    case 2:
      return 3'000;
    case 4:
      return 1'500;
    default:
      return 1'000;
  }
}

int64_t StreamRecords(size_t bytes) {
  if (g_options.stream_records > 0) return g_options.stream_records;
  int64_t n = bytes <= 64 ? 200'000 : bytes <= 4096 ? 50'000 : 4'000;
  return g_options.quick ? n / 50 : n;
}

void BM_Latency(benchmark::State& state, uint32_t consumers, size_t bytes, bool zero_copy) {
  absl::StatusOr<BenchJob> job = MakeJob(consumers);
  if (!job.ok()) {
    state.SkipWithError(job.status().ToString().c_str());
    return;
  }
  // --ipc_pin: the producer on the first CPU of PinOrder(), consumer i on
  // the (i+1)-th (wrapping when there are fewer CPUs than processes).
  const std::vector<int> cpus = g_options.pin ? PinOrder() : std::vector<int>{};
  cpu_set_t saved;
  const bool pinned = !cpus.empty() && sched_getaffinity(0, sizeof(saved), &saved) == 0;
  struct Restore {
    bool on;
    cpu_set_t* mask;
    ~Restore() {
      if (on) sched_setaffinity(0, sizeof(*mask), mask);
    }
  } restore{pinned, &saved};
  Children children;
  for (uint32_t i = 0; i < consumers; ++i) {
    SpmcRing ring = job->ring;
    DoneSlot* slot = &job->done[i];
    const int cpu = pinned ? cpus[(i + 1) % cpus.size()] : -1;
    if (!children.Spawn([=] {
          if (cpu >= 0 && !PinTo(cpu)) std::fprintf(stderr, "consumer %u: cannot pin to cpu %d\n", i, cpu);
          return ConsumerMain(ring, i, slot, BusyPollPolicy(), 0, zero_copy);
        })) {
      state.SkipWithError("fork failed");
      return;
    }
  }
  if (pinned && !PinTo(cpus[0])) {
    state.SkipWithError("cannot pin the producer");
    return;
  }
  absl::StatusOr<RingProducer> p = RingProducer::Create(job->ring, "bench producer");
  if (!p.ok() || !WaitAllReady(job->done, consumers, Deadline::AfterMs(30'000))) {
    state.SkipWithError(p.ok() ? "consumers did not start" : p.status().ToString().c_str());
    return;
  }
  p->set_demote_on_commit(g_options.demote);
  std::vector<uint8_t> payload(bytes, 0x5A);
  LatencyHistogram hist;
  auto one = [&](bool record) -> bool {
    const int64_t t0 = MonotonicNs();
    absl::StatusOr<absl::Span<uint8_t>> buf = p->Reserve(bytes, Deadline::AfterMs(30'000));
    if (!buf.ok()) {
      state.SkipWithError(buf.status().ToString().c_str());
      return false;
    }
    std::memcpy(buf->data(), payload.data(), bytes);
    std::memcpy(buf->data(), &t0, sizeof(t0));
    const uint64_t seq = p->next_seq();
    if (absl::Status c = p->Commit(); !c.ok()) {
      state.SkipWithError(c.ToString().c_str());
      return false;
    }
    const int64_t done = WaitAllDone(job->done, consumers, seq, Deadline::AfterMs(30'000));
    if (done < 0) {
      state.SkipWithError("a consumer failed or timed out");
      return false;
    }
    const int64_t latency = done - t0;
    if (record) {
      hist.Record(static_cast<double>(latency));
      state.SetIterationTime(static_cast<double>(latency) / 1e9);
    }
    return true;
  };
  for (int i = 0; i < 200; ++i) {  // warm-up: page faults, caches, branch predictors
    if (!one(false)) return;
  }
  for (auto _ : state) {
    if (!one(true)) break;
  }
  p->Close();
  if (!children.WaitAll(Deadline::AfterMs(30'000))) {
    state.SkipWithError("consumers did not exit cleanly");
    return;
  }
  LatencySummary s = hist.Summarize();
  state.counters["p50_us"] = s.p50 / 1e3;
  state.counters["p99_us"] = s.p99 / 1e3;
  state.counters["mean_us"] = s.mean / 1e3;
  state.counters["max_us"] = s.max / 1e3;
  state.counters["consumers"] = consumers;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["pinned"] = pinned ? 1 : 0;
  state.counters["demote"] = g_options.demote ? 1 : 0;
}

void BM_Stream(benchmark::State& state, uint32_t consumers, size_t bytes) {
  const int64_t records = StreamRecords(bytes);
  for (auto _ : state) {
    absl::StatusOr<BenchJob> job = MakeJob(consumers);
    if (!job.ok()) {
      state.SkipWithError(job.status().ToString().c_str());
      return;
    }
    Children children;
    for (uint32_t i = 0; i < consumers; ++i) {
      SpmcRing ring = job->ring;
      DoneSlot* slot = &job->done[i];
      uint64_t last = static_cast<uint64_t>(records);
      if (!children.Spawn([=] { return ConsumerMain(ring, i, slot, WaitPolicy{}, last); })) {
        state.SkipWithError("fork failed");
        return;
      }
    }
    absl::StatusOr<RingProducer> p = RingProducer::Create(job->ring, "bench producer");
    if (!p.ok() || !WaitAllReady(job->done, consumers, Deadline::AfterMs(30'000))) {
      state.SkipWithError(p.ok() ? "consumers did not start" : p.status().ToString().c_str());
      return;
    }
    std::vector<uint8_t> payload(bytes, 0xA5);
    const int64_t t0 = MonotonicNs();
    for (int64_t i = 0; i < records; ++i) {
      absl::Status s = p->Publish(payload, Deadline::AfterMs(30'000));
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
    }
    p->Close();
    const int64_t done = WaitAllDone(job->done, consumers, records, Deadline::AfterMs(60'000));
    if (done < 0 || !children.WaitAll(Deadline::AfterMs(30'000))) {
      state.SkipWithError("a consumer failed or timed out");
      return;
    }
    const double secs = static_cast<double>(done - t0) / 1e9;
    state.SetIterationTime(secs);
    state.counters["records_per_s"] = static_cast<double>(records) / secs;
    state.counters["MiB_per_s"] =
        static_cast<double>(records) * static_cast<double>(bytes) / secs / (1 << 20);
    state.counters["ns_per_record"] = secs * 1e9 / static_cast<double>(records);
    state.counters["records"] = static_cast<double>(records);
    state.counters["consumers"] = consumers;
    state.counters["bytes"] = static_cast<double>(bytes);
  }
}

// What a waiter's periodic peer check costs: the /proc probe (ProbeHolder:
// /proc/<pid>/stat read twice) vs a pidfd poll (PidWatch), on a live holder
// (this process's parent, which outlives the benchmark).
void BM_PeerCheck(benchmark::State& state, bool pidfd) {
  alignas(64) static unsigned char storage[sizeof(HeartbeatSlot)];
  auto* slot = new (storage) HeartbeatSlot();
  slot->pid.store(::getppid());
  slot->start_ticks.store(ProcessStartTicks(::getppid()));
  slot->state.store(HeartbeatSlot::kHeld);
  PidWatch watch;
  for (auto _ : state) {
    const ProcState s = pidfd ? watch.Probe(*slot) : ProbeHolder(*slot);
    if (!IsLive(s)) {
      state.SkipWithError("the parent process does not look alive");
      break;
    }
  }
  state.counters["pidfd"] = pidfd && watch.uses_pidfd() ? 1 : 0;
  slot->~HeartbeatSlot();
}

void RegisterAll() {
  benchmark::RegisterBenchmark("BM_PeerCheck/proc", [](benchmark::State& st) { BM_PeerCheck(st, false); })
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_PeerCheck/pidfd", [](benchmark::State& st) { BM_PeerCheck(st, true); })
      ->Unit(benchmark::kMicrosecond);
  for (bool zero_copy : {false, true}) {
    for (uint32_t n : {1u, 2u, 4u, 8u}) {
      for (size_t bytes : {size_t{64}, size_t{4096}, size_t{65536}}) {
        std::string name = std::string(zero_copy ? "BM_LatencyZeroCopy" : "BM_Latency") +
                           "/consumers:" + std::to_string(n) + "/bytes:" + std::to_string(bytes);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [n, bytes, zero_copy](benchmark::State& st) {
                                       BM_Latency(st, n, bytes, zero_copy);
                                     })
            ->UseManualTime()
            ->Iterations(LatencyRecords(n))
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (uint32_t n : {1u, 2u, 4u, 8u}) {
    for (size_t bytes : {size_t{64}, size_t{4096}, size_t{65536}}) {
      std::string name =
          "BM_Stream/consumers:" + std::to_string(n) + "/bytes:" + std::to_string(bytes);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [n, bytes](benchmark::State& st) { BM_Stream(st, n, bytes); })
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Machine facts the latency figures depend on, in the JSON context: the
// clock they are taken with and what one reading costs (on a VM whose clock
// source is not read in user space, e.g. hpet or acpi_pm, every MonotonicNs()
// is a system call the figures include: t0 and each consumer's completion
// stamp), the CPU model, whether it has CLDEMOTE, and the pinning order.
void AddMachineContext() {
  std::string source = "unknown";
  if (FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) {
      source = buf;
      while (!source.empty() && (source.back() == '\n' || source.back() == ' ')) source.pop_back();
    }
    std::fclose(f);
  }
  auto cost = [](int64_t (*clock)()) {
    constexpr int kReads = 20'000;
    int64_t sink = 0;
    const int64_t t0 = MonotonicNs();
    for (int i = 0; i < kReads; ++i) sink += clock();
    const int64_t t1 = MonotonicNs();
    benchmark::DoNotOptimize(sink);
    return static_cast<double>(t1 - t0) / kReads;
  };
  benchmark::AddCustomContext("clocksource", source);
  std::string model = "unknown", cldemote = "no";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      const std::string l = line;
      if (model == "unknown" && l.rfind("model name", 0) == 0 && l.find(':') != std::string::npos) {
        model = l.substr(l.find(':') + 2);
        while (!model.empty() && model.back() == '\n') model.pop_back();
      }
      if (l.rfind("flags", 0) == 0 && l.find(" cldemote") != std::string::npos) cldemote = "yes";
    }
    std::fclose(f);
  }
  benchmark::AddCustomContext("cpu_model", model);
  if (g_options.pin) {
    std::string order;
    for (int c : PinOrder()) order += (order.empty() ? "" : ",") + std::to_string(c);
    benchmark::AddCustomContext("pin_order", order);
  }
  benchmark::AddCustomContext("cpu_has_cldemote", cldemote);
  benchmark::AddCustomContext("monotonic_read_ns", absl::StrFormat("%.1f", cost(&MonotonicNs)));
  benchmark::AddCustomContext("monotonic_coarse_read_ns",
                              absl::StrFormat("%.1f", cost(&MonotonicCoarseNs)));
}

// --help: Google Benchmark's flags, then ours with their defaults.
void PrintHelp() {
  benchmark::PrintDefaultHelp();
  std::vector<std::pair<std::string, const absl::CommandLineFlag*>> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (name.rfind("ipc_", 0) == 0) own.emplace_back(std::string(name), flag);
  }
  std::sort(own.begin(), own.end());
  std::printf("\nipc_bench:\n");
  for (const auto& [name, flag] : own) {
    std::printf("  --%s  %s (default: %s)\n", name.c_str(), flag->Help().c_str(),
                flag->DefaultValue().c_str());
  }
}

}  // namespace
}  // namespace symtp::ipc

int main(int argc, char** argv) {
  // Takes Google Benchmark's flags out of argv (--help prints both sets).
  benchmark::Initialize(&argc, argv, symtp::ipc::PrintHelp);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);  // then ours
  if (rest.size() > 1) {
    std::fprintf(stderr, "ipc_bench: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  symtp::ipc::g_options = {absl::GetFlag(FLAGS_ipc_quick), absl::GetFlag(FLAGS_ipc_pin),
                           absl::GetFlag(FLAGS_ipc_demote),
                           absl::GetFlag(FLAGS_ipc_latency_records),
                           absl::GetFlag(FLAGS_ipc_stream_records)};
  symtp::ipc::AddMachineContext();
  symtp::ipc::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
