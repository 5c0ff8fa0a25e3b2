// GEMM tuning tables: the cuBLASLt algorithm to run per GEMM shape, stored in
// a file so that every process of a job (every TP rank, v0 and v1 alike)
// runs the same algorithms, chosen once, instead of each timing candidates
// at start-up and possibly picking differently (bf16 bits then differ
// between processes).
//
// A table is made by CublasLtHandle::ExportPlans (the plans a handle has
// built, autotuned or not), edited by whatever chose its entries (e.g.
// kernels_bench's in-step A/B, which keeps a tuned pick only where a whole
// decode step got faster), saved, and handed to the runtime
// (`--gemm-tuning-file`), which gives it to every handle
// (CublasLtHandle::set_tuning_table). An algorithm is cuBLASLt's opaque
// cublasLtMatmulAlgo_t, stored byte for byte: cuBLASLt documents that it can
// be stored and restored with the same cuBLASLt version, so the table
// records the version and the device it was made on, and a table made
// elsewhere is refused (FailedPrecondition), never half-applied.
//
// File format (text, one record per line, '#' starts a comment line):
//   symtp-gemm-tuning 1
//   device <sm count> <cc major> <cc minor> <name...>
//   cublaslt <version>
//   gemm m n k lda ldw ldc in out workspace align_a align_w align_c
//        sm_target a0 ... a7 pick_us heuristic_us [description...]
// (one line per gemm record; dtypes by name, a0-a7 the algorithm's eight
// 64-bit words in hex, times in microseconds per call, 0 when not timed).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/comm.h"

namespace symtp::kernels {

// What a plan is cached by (every field cuBLASLt's choice can depend on).
struct GemmTuningKey {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldw = 0, ldc = 0;
  DType in_dtype = DType::kBF16, out_dtype = DType::kBF16;
  uint64_t workspace_bytes = 0;
  int align_a = 0, align_w = 0, align_c = 0;  // pointer alignment in bytes (power of two <= 256)
  int sm_count_target = 0;
  auto operator<=>(const GemmTuningKey&) const = default;
};

// "C[256,4096] K=14336 bf16->bf16" (plus strides, workspace, alignments and
// SM target when they are not the defaults), for messages.
std::string DescribeGemmKey(const GemmTuningKey& key);

struct GemmTuningEntry {
  std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t's bytes
  // Per call, to the nanosecond (the file's precision), when autotuning
  // timed them; 0: not timed.
  double pick_us = 0;              // this algorithm
  double heuristic_us = 0;         // cuBLASLt's first heuristic pick
  std::string description;         // "algo 66 tile 18 ...", for people (not read back as data)
  bool operator==(const GemmTuningEntry&) const = default;
};

// Where a table's algorithms are valid.
struct GemmTuningIdentity {
  std::string device;  // the device's name, e.g. "NVIDIA H200"
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int64_t cublaslt_version = 0;  // cublasLtGetVersion()
  bool operator==(const GemmTuningIdentity&) const = default;
};

// "NVIDIA H200 (sm_90, 132 SMs), cuBLASLt 130100".
std::string DescribeIdentity(const GemmTuningIdentity& id);

// The identity of the current CUDA device and the loaded cuBLASLt.
absl::StatusOr<GemmTuningIdentity> CurrentGemmTuningIdentity();

class GemmTuningTable {
 public:
  GemmTuningTable() = default;
  explicit GemmTuningTable(GemmTuningIdentity id) : identity_(std::move(id)) {}

  const GemmTuningIdentity& identity() const { return identity_; }
  size_t size() const { return entries_.size(); }
  const std::map<GemmTuningKey, GemmTuningEntry>& entries() const { return entries_; }
  // nullptr when the table has no entry for `key`.
  const GemmTuningEntry* Find(const GemmTuningKey& key) const;
  // Adds or replaces.
  void Put(const GemmTuningKey& key, GemmTuningEntry entry);
  bool Erase(const GemmTuningKey& key);

  // The file's text (format above); Parse(Serialize()) == *this.
  std::string Serialize() const;
  // InvalidArgument naming `source` and the line for a malformed file (bad
  // header or version, unknown dtype, a field out of range, a duplicate key).
  static absl::StatusOr<GemmTuningTable> Parse(absl::string_view text, absl::string_view source);
  // Written to a temporary file in the same directory, then renamed over
  // `path` (a reader never sees half a table).
  absl::Status Save(const std::string& path) const;
  static absl::StatusOr<GemmTuningTable> Load(const std::string& path);

  // OK when the table was made where it is used; FailedPrecondition naming
  // both identities otherwise.
  absl::Status CheckUsableOn(const GemmTuningIdentity& here) const;

  bool operator==(const GemmTuningTable&) const = default;

 private:
  GemmTuningIdentity identity_;
  std::map<GemmTuningKey, GemmTuningEntry> entries_;
};

// Shipped tables (`configs/gemm_tuning/`, one file per device and cuBLASLt
// version, made by the runtime's in-run tuning): `--gemm-tuning-file=auto`
// runs the one made where it runs, and cuBLASLt's heuristic where none was.
struct FoundGemmTuningTable {
  std::string path;
  GemmTuningTable table;
};

// $SYMTP_GEMM_TUNING_DIR when set, else the source tree's configs/gemm_tuning
// (compiled in).
std::string DefaultGemmTuningDir();

// The table in `dir` (every `*.txt` file, each of which must parse) whose
// identity is `here`; nullopt when none is. NotFound when `dir` cannot be
// listed, InvalidArgument naming the file for a malformed one,
// FailedPrecondition when two files claim `here`.
absl::StatusOr<std::optional<FoundGemmTuningTable>> FindGemmTuningTable(
    const std::string& dir, const GemmTuningIdentity& here);

// --gemm-tuning-file=auto's lookup: FindGemmTuningTable in
// DefaultGemmTuningDir(). A compiled-in folder that is gone (a binary moved
// away from its source tree) means no table; a $SYMTP_GEMM_TUNING_DIR that
// cannot be listed is an error (NotFound), as is any malformed table.
absl::StatusOr<std::optional<FoundGemmTuningTable>> FindShippedGemmTuningTable(
    const GemmTuningIdentity& here);

// A --gemm-tuning-file value: "none" (nullopt), "auto" (the shipped table of
// the current device and cuBLASLt, FindShippedGemmTuningTable; nullopt when
// none was made here) or a file (Load). Errors name the value.
absl::StatusOr<std::optional<FoundGemmTuningTable>> ResolveGemmTuningFile(const std::string& value);

}  // namespace symtp::kernels
