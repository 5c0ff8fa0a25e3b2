#include "kernels/ops/gemm_tuning.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"

namespace symtp::kernels {
namespace {

constexpr absl::string_view kMagic = "symtp-gemm-tuning";
constexpr int kFormatVersion = 1;

bool ParseDType(absl::string_view s, DType* out) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (s == DTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

bool IsAlignment(int a) { return a >= 1 && a <= 256 && (a & (a - 1)) == 0; }

}  // namespace

std::string DescribeGemmKey(const GemmTuningKey& k) {
  std::string s = absl::StrFormat("C[%d,%d] K=%d %s->%s", k.m, k.n, k.k, DTypeName(k.in_dtype),
                                  DTypeName(k.out_dtype));
  if (k.lda != k.k || k.ldw != k.k || k.ldc != k.n) {
    absl::StrAppendFormat(&s, " ld %d/%d/%d", k.lda, k.ldw, k.ldc);
  }
  absl::StrAppendFormat(&s, " ws %d align %d/%d/%d", k.workspace_bytes, k.align_a, k.align_w,
                        k.align_c);
  if (k.sm_count_target > 0) absl::StrAppendFormat(&s, " sms %d", k.sm_count_target);
  return s;
}

std::string DescribeIdentity(const GemmTuningIdentity& id) {
  return absl::StrFormat("%s (sm_%d%d, %d SMs), cuBLASLt %d", id.device, id.cc_major, id.cc_minor,
                         id.sm_count, id.cublaslt_version);
}

absl::StatusOr<GemmTuningIdentity> CurrentGemmTuningIdentity() {
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
  GemmTuningIdentity id;
  id.device = prop.name;
  id.sm_count = prop.multiProcessorCount;
  id.cc_major = prop.major;
  id.cc_minor = prop.minor;
  id.cublaslt_version = static_cast<int64_t>(cublasLtGetVersion());
  return id;
}

const GemmTuningEntry* GemmTuningTable::Find(const GemmTuningKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void GemmTuningTable::Put(const GemmTuningKey& key, GemmTuningEntry entry) {
  entries_[key] = std::move(entry);
}

bool GemmTuningTable::Erase(const GemmTuningKey& key) { return entries_.erase(key) > 0; }

std::string GemmTuningTable::Serialize() const {
  std::string s = absl::StrCat(kMagic, " ", kFormatVersion, "\n");
  absl::StrAppendFormat(&s, "device %d %d %d %s\n", identity_.sm_count, identity_.cc_major,
                        identity_.cc_minor, identity_.device);
  absl::StrAppendFormat(&s, "cublaslt %d\n", identity_.cublaslt_version);
  s += "# gemm m n k lda ldw ldc in out workspace align_a align_w align_c sm_target "
       "algo[8] pick_us heuristic_us description\n";
  for (const auto& [k, e] : entries_) {
    absl::StrAppendFormat(&s, "gemm %d %d %d %d %d %d %s %s %d %d %d %d %d", k.m, k.n, k.k, k.lda,
                          k.ldw, k.ldc, DTypeName(k.in_dtype), DTypeName(k.out_dtype),
                          k.workspace_bytes, k.align_a, k.align_w, k.align_c, k.sm_count_target);
    for (uint64_t w : e.algo) absl::StrAppendFormat(&s, " %016x", w);
    absl::StrAppendFormat(&s, " %.3f %.3f", e.pick_us, e.heuristic_us);
    if (!e.description.empty()) absl::StrAppend(&s, " ", e.description);
    s += "\n";
  }
  return s;
}

absl::StatusOr<GemmTuningTable> GemmTuningTable::Parse(absl::string_view text,
                                                       absl::string_view source) {
  GemmTuningTable t;
  bool have_magic = false, have_device = false, have_version = false;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GEMM tuning file %s, line %d: %s: '%s'", source, line_no, why, line));
    };
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!have_magic) {
      int version = 0;
      if (f.size() != 2 || f[0] != kMagic) return bad("not a symtp GEMM tuning file");
      if (!absl::SimpleAtoi(f[1], &version) || version != kFormatVersion) {
        return bad(
            absl::StrCat("format version ", f[1], " (this build reads ", kFormatVersion, ")"));
      }
      have_magic = true;
      continue;
    }
    if (f[0] == "device") {
      if (have_device || f.size() < 5 || !absl::SimpleAtoi(f[1], &t.identity_.sm_count) ||
          !absl::SimpleAtoi(f[2], &t.identity_.cc_major) ||
          !absl::SimpleAtoi(f[3], &t.identity_.cc_minor)) {
        return bad("expected one 'device <sms> <cc major> <cc minor> <name>'");
      }
      t.identity_.device = absl::StrJoin(f.begin() + 4, f.end(), " ");
      have_device = true;
    } else if (f[0] == "cublaslt") {
      if (have_version || f.size() != 2 || !absl::SimpleAtoi(f[1], &t.identity_.cublaslt_version)) {
        return bad("expected one 'cublaslt <version>'");
      }
      have_version = true;
    } else if (f[0] == "gemm") {
      if (!have_device || !have_version)
        return bad("gemm record before the device / cublaslt lines");
      if (f.size() < 24) return bad("a gemm record has at least 24 fields");
      GemmTuningKey k;
      GemmTuningEntry e;
      int64_t* ints[] = {&k.m, &k.n, &k.k, &k.lda, &k.ldw, &k.ldc};
      for (int i = 0; i < 6; ++i) {
        if (!absl::SimpleAtoi(f[1 + i], ints[i]) || *ints[i] < 0) {
          return bad(absl::StrCat("field ", 2 + i, " is not a size"));
        }
      }
      if (k.n <= 0 || k.k <= 0 || k.lda < k.k || k.ldw < k.k || k.ldc < k.n) {
        return bad("not a GEMM shape (n, k > 0; lda, ldw >= k; ldc >= n)");
      }
      if (!ParseDType(f[7], &k.in_dtype) || !ParseDType(f[8], &k.out_dtype)) {
        return bad("unknown dtype");
      }
      if (!absl::SimpleAtoi(f[9], &k.workspace_bytes) || !absl::SimpleAtoi(f[10], &k.align_a) ||
          !absl::SimpleAtoi(f[11], &k.align_w) || !absl::SimpleAtoi(f[12], &k.align_c) ||
          !absl::SimpleAtoi(f[13], &k.sm_count_target) || !IsAlignment(k.align_a) ||
          !IsAlignment(k.align_w) || !IsAlignment(k.align_c) || k.sm_count_target < 0) {
        return bad("bad workspace, alignment or SM target");
      }
      for (int i = 0; i < 8; ++i) {
        if (f[14 + i].size() != 16 || !absl::SimpleHexAtoi(f[14 + i], &e.algo[i])) {
          return bad(absl::StrCat("algorithm word ", i, " is not 16 hex digits"));
        }
      }
      if (!absl::SimpleAtod(f[22], &e.pick_us) || !absl::SimpleAtod(f[23], &e.heuristic_us) ||
          !(e.pick_us >= 0) || !(e.heuristic_us >= 0)) {
        return bad("bad pick_us / heuristic_us");
      }
      e.description = absl::StrJoin(f.begin() + 24, f.end(), " ");
      if (t.entries_.count(k) != 0) return bad("a second record for the same GEMM");
      t.entries_.emplace(k, std::move(e));
    } else {
      return bad("unknown record");
    }
  }
  if (!have_magic || !have_device || !have_version) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GEMM tuning file %s: no '%s %d' header with device and cublaslt lines",
                        source, kMagic, kFormatVersion));
  }
  return t;
}

absl::Status GemmTuningTable::Save(const std::string& path) const {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << Serialize();
    out.flush();
    if (!out) {
      const int err = errno;  // before remove() can overwrite it
      std::remove(tmp.c_str());
      return absl::UnavailableError(
          absl::StrFormat("writing GEMM tuning file %s failed: %s", tmp, std::strerror(err)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrFormat("renaming %s to %s failed: %s", tmp, path, std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<GemmTuningTable> GemmTuningTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("cannot open GEMM tuning file %s: %s", path, std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(absl::StrFormat("reading GEMM tuning file %s failed", path));
  }
  return Parse(ss.str(), path);
}

absl::Status GemmTuningTable::CheckUsableOn(const GemmTuningIdentity& here) const {
  if (identity_ == here) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "GEMM tuning table made on %s cannot be used on %s (cuBLASLt algorithms are valid only "
      "for the version and device they were chosen on; make a new table)",
      DescribeIdentity(identity_), DescribeIdentity(here)));
}

namespace {
const char* GemmTuningDirFromEnv() {
  const char* env = std::getenv("SYMTP_GEMM_TUNING_DIR");
  return env != nullptr && *env != '\0' ? env : nullptr;
}
}  // namespace

std::string DefaultGemmTuningDir() {
  const char* env = GemmTuningDirFromEnv();
  return env != nullptr ? env : SYMTP_GEMM_TUNING_DIR;
}

absl::StatusOr<std::optional<FoundGemmTuningTable>> FindGemmTuningTable(
    const std::string& dir, const GemmTuningIdentity& here) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrFormat("cannot list GEMM tuning tables in %s: %s", dir, ec.message()));
  }
  std::vector<std::string> files;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::directory_entry& e = *it;
    if (e.path().extension() == ".txt" && e.is_regular_file(ec)) files.push_back(e.path().string());
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrFormat("listing GEMM tuning tables in %s failed: %s", dir, ec.message()));
  }
  std::sort(files.begin(), files.end());
  std::optional<FoundGemmTuningTable> found;
  for (const std::string& f : files) {
    SYMTP_ASSIGN_OR_RETURN(GemmTuningTable t, GemmTuningTable::Load(f));
    if (t.identity() != here) continue;
    if (found) {
      return absl::FailedPreconditionError(
          absl::StrFormat("GEMM tuning tables %s and %s are both for %s: keep one", found->path, f,
                          DescribeIdentity(here)));
    }
    found = FoundGemmTuningTable{f, std::move(t)};
  }
  return found;
}

absl::StatusOr<std::optional<FoundGemmTuningTable>> FindShippedGemmTuningTable(
    const GemmTuningIdentity& here) {
  const std::string dir = DefaultGemmTuningDir();
  std::error_code ec;
  if (GemmTuningDirFromEnv() == nullptr && !std::filesystem::exists(dir, ec)) {
    return std::nullopt;
  }
  return FindGemmTuningTable(dir, here);
}

absl::StatusOr<std::optional<FoundGemmTuningTable>> ResolveGemmTuningFile(
    const std::string& value) {
  if (value == "none") return std::nullopt;
  if (value == "auto") {
    absl::StatusOr<GemmTuningIdentity> here = CurrentGemmTuningIdentity();
    if (!here.ok()) return Annotate(here.status(), "--gemm-tuning-file=auto");
    absl::StatusOr<std::optional<FoundGemmTuningTable>> found = FindShippedGemmTuningTable(*here);
    if (!found.ok()) return Annotate(found.status(), "--gemm-tuning-file=auto");
    return found;
  }
  absl::StatusOr<GemmTuningTable> table = GemmTuningTable::Load(value);
  if (!table.ok()) return Annotate(table.status(), "--gemm-tuning-file");
  return FoundGemmTuningTable{value, *std::move(table)};
}

}  // namespace symtp::kernels
