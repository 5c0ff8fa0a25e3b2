#include "ipc/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/env.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace symtp::ipc {

namespace bip = boost::interprocess;

namespace internal {

struct RegionEntry {
  char name[32];  // NUL-terminated
  uint64_t offset;
  uint64_t bytes;
};
static_assert(sizeof(RegionEntry) == 48);

// Plain data (trivially copyable, so ListSegments can pread() it into a local
// copy). The two fields that other processes poll, `magic` and
// `num_regions`, are accessed through std::atomic_ref: magic is stored last
// with release when the header is complete; num_regions is stored with
// release after the new entry is written.
struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  int32_t creator_pid;
  uint32_t reserved0;
  uint64_t creator_start_ticks;
  int64_t created_unix_ns;
  uint64_t total_bytes;
  uint32_t num_regions;
  uint32_t max_regions;
  uint64_t next_free;  // offset of the next region; written by the creator only
  RegionEntry regions[ShmSegment::kMaxRegions];
};
static_assert(sizeof(SegmentHeader) <= ShmSegment::kHeaderBytes);
static_assert(std::is_trivially_copyable_v<SegmentHeader>);
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

}  // namespace internal

using internal::SegmentHeader;

namespace {

constexpr char kShmDir[] = "/dev/shm/";

// ---------------------------------------------------------------------------
// Cleanup registry: names this process created, unlinked on SIGINT/SIGTERM and
// at exit. A fixed array (no allocation in the signal handler); each entry
// records its owner pid so that a forked child never unlinks its parent's
// segments.

constexpr int kMaxCleanupEntries = 128;
constexpr size_t kMaxPath = 256;

struct CleanupEntry {
  std::atomic<int> state;  // 0 free, 1 being written / retired, 2 armed
  std::atomic<pid_t> owner;
  char path[kMaxPath];
};
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<pid_t>::is_always_lock_free);

CleanupEntry g_cleanup[kMaxCleanupEntries];

struct sigaction g_prev_sigint;
struct sigaction g_prev_sigterm;
volatile sig_atomic_t g_in_handler = 0;
std::mutex g_install_mu;  // serializes (re)installation; never taken in the handler

void UnlinkOwned() {
  pid_t self = ::getpid();
  for (CleanupEntry& e : g_cleanup) {
    if (e.state.load(std::memory_order_acquire) != 2) continue;
    if (e.owner.load(std::memory_order_relaxed) != self) continue;
    ::unlink(e.path);  // async-signal-safe; ENOENT is fine
  }
}

void OnTerminationSignal(int sig, siginfo_t* info, void* ucontext) {
  int saved_errno = errno;
  UnlinkOwned();
  // A handler installed after ours that chains back to us must not loop.
  if (g_in_handler != 0) {
    errno = saved_errno;
    return;
  }
  g_in_handler = 1;
  const struct sigaction& prev = sig == SIGINT ? g_prev_sigint : g_prev_sigterm;
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, ucontext);
  } else if (prev.sa_handler == SIG_IGN) {
    // Not reached: we do not install over SIG_IGN.
  } else if (prev.sa_handler == SIG_DFL) {
    // Re-raise with the default action: the signal is blocked while this
    // handler runs, so it is delivered (and terminates) when we return.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
  } else if (prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
  }
  g_in_handler = 0;
  errno = saved_errno;
}

bool IsOurs(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) != 0 && sa.sa_sigaction == &OnTerminationSignal;
}

// Puts our handler in front of whatever handles `sig` now (unless that is
// already ours, or the signal is ignored: an ignored signal stays ignored).
void InstallOne(int sig, struct sigaction* prev) {
  struct sigaction current;
  if (::sigaction(sig, nullptr, &current) != 0) return;
  if (IsOurs(current)) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN) return;
  // Block the signal while `prev` is rewritten so that a concurrent delivery
  // never sees a half-written struct.
  sigset_t block;
  sigset_t old;
  sigemptyset(&block);
  sigaddset(&block, sig);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  *prev = current;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = &OnTerminationSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(sig, &sa, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void InstallCleanupHooks() {
  static std::once_flag atexit_once;
  std::call_once(atexit_once, [] { std::atexit([] { UnlinkOwned(); }); });
  std::lock_guard<std::mutex> lock(g_install_mu);
  InstallOne(SIGINT, &g_prev_sigint);
  InstallOne(SIGTERM, &g_prev_sigterm);
}

// Returns the registry slot, or -1 if the registry is full.
int RegisterForCleanup(const std::string& name) {
  InstallCleanupHooks();
  std::string path = kShmDir + name;
  if (path.size() >= kMaxPath) return -1;  // names are validated to be shorter
  for (int i = 0; i < kMaxCleanupEntries; ++i) {
    CleanupEntry& e = g_cleanup[i];
    int expected = 0;
    if (!e.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(e.path, path.c_str(), path.size() + 1);
    e.owner.store(::getpid(), std::memory_order_relaxed);
    e.state.store(2, std::memory_order_release);
    return i;
  }
  SYMTP_LOG(WARN, "ipc") << "more than " << kMaxCleanupEntries
                         << " live segments in this process: " << name
                         << " will not be unlinked on SIGINT/SIGTERM or at exit";
  return -1;
}

void UnregisterFromCleanup(int slot) {
  if (slot < 0 || slot >= kMaxCleanupEntries) return;
  CleanupEntry& e = g_cleanup[slot];
  if (e.owner.load(std::memory_order_relaxed) != ::getpid()) return;  // inherited over fork
  int expected = 2;
  if (e.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    e.owner.store(0, std::memory_order_relaxed);
    e.state.store(0, std::memory_order_release);
  }
}

// ---------------------------------------------------------------------------

absl::Status ValidateName(const std::string& name) {
  if (name.empty() || name.size() > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name must be 1..200 characters, got ", name.size(), ": '", name, "'"));
  }
  if (name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("shm name must not start with '.': ", name));
  }
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != '-' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("shm name may only contain [A-Za-z0-9._-]: '", name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status BoostError(const bip::interprocess_exception& e, absl::string_view call,
                        const std::string& name, const char* file, int line) {
  int native = e.get_native_error();
  if (native != 0) {
    return Annotate(ErrnoToStatus(native, call, file, line), absl::StrCat("shm '", name, "'"));
  }
  return absl::InternalError(
      absl::StrCat("shm '", name, "': ", call, " (", SourceLocation(file, line), "): ", e.what()));
}

size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

uint64_t LoadMagic(const SegmentHeader& h) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(h.magic)).load(std::memory_order_acquire);
}
uint32_t LoadNumRegions(const SegmentHeader& h) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(h.num_regions))
      .load(std::memory_order_acquire);
}

// Validates a header copy or mapping against the object's real size. `not_ready`
// is set when the only problem is a zero magic (the creator is still writing it).
absl::Status CheckHeader(const SegmentHeader& h, uint64_t actual_size, const std::string& name,
                         bool* not_ready) {
  if (not_ready != nullptr) *not_ready = false;
  uint64_t magic = LoadMagic(h);
  if (magic == 0) {
    if (not_ready != nullptr) *not_ready = true;
    return absl::FailedPreconditionError(absl::StrFormat(
        "shm '%s' is not initialized (magic 0; its creator may still be writing the header)",
        name));
  }
  if (magic != ShmSegment::kMagic) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shm '%s' is not a symtp segment: magic 0x%016x, expected 0x%016x", name,
                        magic, ShmSegment::kMagic));
  }
  if (h.layout_version != ShmSegment::kLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shm '%s' has layout version %u, this build understands %u (mixed binaries?)", name,
        h.layout_version, ShmSegment::kLayoutVersion));
  }
  if (h.header_bytes != ShmSegment::kHeaderBytes || h.max_regions != ShmSegment::kMaxRegions) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shm '%s' header geometry mismatch: header %u bytes / %u regions, "
        "expected %u / %u",
        name, h.header_bytes, h.max_regions, ShmSegment::kHeaderBytes, ShmSegment::kMaxRegions));
  }
  if (h.total_bytes != actual_size) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shm '%s' size mismatch: header says %u bytes, the object has %u", name,
                        h.total_bytes, actual_size));
  }
  uint32_t n = LoadNumRegions(h);
  if (n > ShmSegment::kMaxRegions) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shm '%s' has a corrupt region table (%u entries)", name, n));
  }
  for (uint32_t i = 0; i < n; ++i) {
    const internal::RegionEntry& r = h.regions[i];
    if (r.offset < ShmSegment::kHeaderBytes || r.offset > actual_size ||
        r.bytes > actual_size - r.offset || ::memchr(r.name, '\0', sizeof(r.name)) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrFormat("shm '%s' has a corrupt region table entry %u", name, i));
    }
  }
  return absl::OkStatus();
}

// posix_fallocate over the whole object: ResourceExhausted naming the size
// and /dev/shm's free space when the pages are not there.
absl::Status Reserve(int fd, const std::string& name, size_t total) {
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
  if (rc == 0) return absl::OkStatus();
  if (rc == ENOSPC || rc == ENOMEM || rc == EFBIG) {
    struct statvfs vfs;
    const std::string free_text =
        ::statvfs(kShmDir, &vfs) == 0
            ? absl::StrFormat("%u KiB free there", static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 1024)
            : std::string("free space unknown");
    return absl::ResourceExhaustedError(absl::StrFormat(
        "shm '%s': /dev/shm cannot hold the job's segment of %u bytes (%.2f MiB; %s): "
        "posix_fallocate: %s",
        name, total, total / 1048576.0, free_text, std::strerror(rc)));
  }
  return absl::InternalError(absl::StrFormat("shm '%s': reserving %u bytes in /dev/shm: posix_fallocate: %s",
                                             name, total, std::strerror(rc)));
}

}  // namespace

// ---------------------------------------------------------------------------

struct ShmSegment::Mapping {
  bip::mapped_region region;
  std::mutex allocate_mu;
};

ShmSegment::ShmSegment(std::string name, std::unique_ptr<Mapping> mapping, pid_t owner_pid)
    : name_(std::move(name)), mapping_(std::move(mapping)), owner_pid_(owner_pid) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)),
      mapping_(std::move(other.mapping_)),
      owner_pid_(std::exchange(other.owner_pid_, 0)),
      removed_(std::exchange(other.removed_, false)),
      cleanup_slot_(std::exchange(other.cleanup_slot_, -1)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    ShmSegment old(std::move(*this));  // releases what this held, at the end of the scope
    name_ = std::move(other.name_);
    mapping_ = std::move(other.mapping_);
    owner_pid_ = std::exchange(other.owner_pid_, 0);
    removed_ = std::exchange(other.removed_, false);
    cleanup_slot_ = std::exchange(other.cleanup_slot_, -1);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  mapping_.reset();  // unmap
  if (owner_pid_ != 0 && owner_pid_ == ::getpid() && !removed_) {
    absl::Status s = Remove();
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      SYMTP_LOG(WARN, "ipc") << "removing shm '" << name_ << "': " << s;
    }
  }
  owner_pid_ = 0;
}

std::string ShmSegment::NewJobName() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) {
    std::random_device rd;
    r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(MonotonicNs());
  }
  return absl::StrFormat("%s_%016x", env::ShmPrefix(), r);
}

size_t ShmSegment::RegionFootprint(size_t bytes) { return RoundUp(bytes, kRegionAlignment); }

absl::StatusOr<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes) {
  SYMTP_RETURN_IF_ERROR(ValidateName(name));
  if (bytes > (size_t{1} << 44)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm '", name, "': ", bytes, " bytes requested, more than 16 TiB"));
  }
  const size_t total = kHeaderBytes + RegionFootprint(bytes);
  auto mapping = std::make_unique<Mapping>();
  bool created = false;
  int cleanup_slot = -1;
  try {
    bip::permissions perm(0600);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perm);
    created = true;
    cleanup_slot = RegisterForCleanup(name);
    shm.truncate(static_cast<bip::offset_t>(total));
    // ftruncate reserves no page on tmpfs: a full /dev/shm would show later
    // as SIGBUS in whichever process first touches a missing page. Reserve
    // every page now so that a shortage is this one error.
    if (absl::Status s = Reserve(shm.get_mapping_handle().handle, name, total); !s.ok()) {
      bip::shared_memory_object::remove(name.c_str());
      UnregisterFromCleanup(cleanup_slot);
      return s;
    }
    mapping->region = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    absl::Status s = BoostError(e, created ? "ftruncate/mmap" : "shm_open(O_CREAT|O_EXCL, 0600)",
                                name, __FILE__, __LINE__);
    if (created) {
      bip::shared_memory_object::remove(name.c_str());
      UnregisterFromCleanup(cleanup_slot);
    }
    return s;
  }
  if (mapping->region.get_size() != total) {
    bip::shared_memory_object::remove(name.c_str());
    UnregisterFromCleanup(cleanup_slot);
    return absl::InternalError(absl::StrFormat("shm '%s': mapped %u bytes, expected %u", name,
                                               mapping->region.get_size(), total));
  }
  auto* h = static_cast<SegmentHeader*>(mapping->region.get_address());
  // ftruncate zero-fills; write everything but the magic, then publish it.
  h->layout_version = kLayoutVersion;
  h->header_bytes = kHeaderBytes;
  h->creator_pid = ::getpid();
  h->creator_start_ticks = ProcessStartTicks(::getpid());
  h->created_unix_ns = WallClockNs();
  h->total_bytes = total;
  h->max_regions = kMaxRegions;
  h->next_free = kHeaderBytes;
  std::atomic_ref<uint32_t>(h->num_regions).store(0, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  SYMTP_LOG(DEBUG, "ipc") << "created shm '" << name << "' (" << total << " bytes)";
  ShmSegment seg(name, std::move(mapping), ::getpid());
  seg.cleanup_slot_ = cleanup_slot;
  return seg;
}

absl::StatusOr<ShmSegment> ShmSegment::AttachInternal(const std::string& name, bool* retryable) {
  *retryable = false;
  SYMTP_RETURN_IF_ERROR(ValidateName(name));
  auto mapping = std::make_unique<Mapping>();
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!shm.get_size(size)) {
      return ErrnoToStatus(errno, "fstat", __FILE__, __LINE__);
    }
    if (static_cast<uint64_t>(size) < kHeaderBytes) {
      *retryable = true;  // the creator may not have sized it yet
      return absl::FailedPreconditionError(absl::StrFormat(
          "shm '%s' is not initialized or not a symtp segment: %d bytes, the header alone is %u",
          name, size, kHeaderBytes));
    }
    mapping->region = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    absl::Status s = BoostError(e, "shm_open/mmap", name, __FILE__, __LINE__);
    *retryable = s.code() == absl::StatusCode::kNotFound;
    return s;
  }
  const auto* h = static_cast<const SegmentHeader*>(mapping->region.get_address());
  SYMTP_RETURN_IF_ERROR(CheckHeader(*h, mapping->region.get_size(), name, retryable));
  return ShmSegment(name, std::move(mapping), 0);
}

absl::StatusOr<ShmSegment> ShmSegment::Attach(const std::string& name) {
  bool retryable;
  return AttachInternal(name, &retryable);
}

absl::StatusOr<ShmSegment> ShmSegment::Attach(const std::string& name, Deadline deadline) {
  while (true) {
    bool retryable = false;
    absl::StatusOr<ShmSegment> seg = AttachInternal(name, &retryable);
    if (seg.ok() || !retryable) return seg;
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(
          absl::StrCat("attaching shm '", name, "' before the deadline: ", seg.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

SegmentHeader* ShmSegment::header() const {
  return mapping_ ? static_cast<SegmentHeader*>(mapping_->region.get_address()) : nullptr;
}

void* ShmSegment::base() const { return mapping_ ? mapping_->region.get_address() : nullptr; }
size_t ShmSegment::size() const { return mapping_ ? mapping_->region.get_size() : 0; }
bool ShmSegment::is_creator() const { return owner_pid_ != 0 && owner_pid_ == ::getpid(); }
pid_t ShmSegment::creator_pid() const { return header() != nullptr ? header()->creator_pid : 0; }

size_t ShmSegment::bytes_free() const {
  SegmentHeader* h = header();
  if (h == nullptr) return 0;
  if (!is_creator()) {
    // next_free is creator-private; derive it from the published table.
    uint32_t n = LoadNumRegions(*h);
    uint64_t end = kHeaderBytes;
    for (uint32_t i = 0; i < n; ++i) {
      end = std::max<uint64_t>(
          end, h->regions[i].offset + RoundUp(h->regions[i].bytes, kRegionAlignment));
    }
    return size() - end;
  }
  std::lock_guard<std::mutex> lock(mapping_->allocate_mu);
  return size() - h->next_free;
}

absl::StatusOr<void*> ShmSegment::Allocate(absl::string_view region, size_t bytes) {
  SegmentHeader* h = header();
  if (h == nullptr) return absl::FailedPreconditionError("Allocate on a moved-from ShmSegment");
  if (!is_creator()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shm '%s': only the creator (pid %d) allocates regions; this process (pid %d) attached",
        name_, h->creator_pid, ::getpid()));
  }
  if (region.empty() || region.size() > kMaxRegionNameLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm '%s': region name must be 1..%u characters, got '%s'", name_,
                        kMaxRegionNameLength, region));
  }
  std::lock_guard<std::mutex> lock(mapping_->allocate_mu);
  uint32_t n = LoadNumRegions(*h);
  for (uint32_t i = 0; i < n; ++i) {
    if (region == absl::string_view(h->regions[i].name)) {
      return absl::AlreadyExistsError(
          absl::StrFormat("shm '%s': region '%s' already exists", name_, region));
    }
  }
  if (n >= kMaxRegions) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "shm '%s': region table full (%u regions) allocating '%s'", name_, kMaxRegions, region));
  }
  const uint64_t footprint = RegionFootprint(bytes);
  if (footprint > size() - h->next_free) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("shm '%s': region '%s' needs %u bytes, only %u of %u left", name_, region,
                        footprint, size() - h->next_free, size() - kHeaderBytes));
  }
  internal::RegionEntry& e = h->regions[n];
  std::memset(e.name, 0, sizeof(e.name));
  std::memcpy(e.name, region.data(), region.size());
  e.offset = h->next_free;
  e.bytes = bytes;
  h->next_free += footprint;
  // Zero-filled: regions are carved once from memory that ftruncate zeroed and
  // never reused, so there is nothing to clear (and no page is touched here).
  char* addr = static_cast<char*>(base()) + e.offset;
  std::atomic_ref<uint32_t>(h->num_regions).store(n + 1, std::memory_order_release);
  return static_cast<void*>(addr);
}

absl::StatusOr<std::pair<void*, size_t>> ShmSegment::Find(absl::string_view region) const {
  SegmentHeader* h = header();
  if (h == nullptr) return absl::FailedPreconditionError("Find on a moved-from ShmSegment");
  uint32_t n = LoadNumRegions(*h);
  std::vector<std::string> names;
  for (uint32_t i = 0; i < n; ++i) {
    const internal::RegionEntry& e = h->regions[i];
    if (region == absl::string_view(e.name)) {
      return std::make_pair(static_cast<void*>(static_cast<char*>(base()) + e.offset),
                            static_cast<size_t>(e.bytes));
    }
    names.emplace_back(e.name);
  }
  return absl::NotFoundError(absl::StrFormat("shm '%s' has no region '%s' (regions: [%s])", name_,
                                             region, absl::StrJoin(names, ", ")));
}

absl::Status ShmSegment::Remove() {
  if (!is_creator()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm '", name_, "': only its creator removes it"));
  }
  if (removed_) return absl::OkStatus();
  removed_ = true;
  UnregisterFromCleanup(std::exchange(cleanup_slot_, -1));
  if (::shm_unlink(("/" + name_).c_str()) != 0 && errno != ENOENT) {
    return Annotate(ErrnoToStatus(errno, "shm_unlink", __FILE__, __LINE__),
                    absl::StrCat("removing shm '", name_, "'"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::vector<SegmentInfo>> ListSegments(const std::string& prefix) {
  DIR* dir = ::opendir(kShmDir);
  if (dir == nullptr) {
    return Annotate(ErrnoToStatus(errno, "opendir(/dev/shm)", __FILE__, __LINE__),
                    "listing segments");
  }
  std::vector<SegmentInfo> out;
  while (dirent* d = ::readdir(dir)) {
    std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    SegmentInfo info;
    info.name = name;
    std::string path = kShmDir + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0) {
      if (errno == ENOENT) continue;  // removed meanwhile
      info.problem = absl::StrCat("cannot open: ", std::strerror(errno));
      if (::stat(path.c_str(), &st) == 0) {
        info.bytes = st.st_size;
        info.created_unix_ns = st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec;
      }
      out.push_back(std::move(info));
      continue;
    }
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      continue;
    }
    info.bytes = st.st_size;
    info.created_unix_ns = st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec;
    SegmentHeader h;
    std::memset(&h, 0, sizeof(h));
    ssize_t n = ::pread(fd, &h, sizeof(h), 0);
    ::close(fd);
    if (n != static_cast<ssize_t>(sizeof(h))) {
      info.problem = absl::StrCat("too small for a header (", st.st_size, " bytes)");
    } else {
      absl::Status s = CheckHeader(h, st.st_size, name, nullptr);
      if (!s.ok()) {
        info.problem = std::string(s.message());
      } else {
        info.header_valid = true;
        info.creator_pid = h.creator_pid;
        info.created_unix_ns = h.created_unix_ns;
        info.creator_state = ProbeProcess(h.creator_pid, h.creator_start_ticks);
        info.creator_alive = IsLive(info.creator_state);
      }
    }
    out.push_back(std::move(info));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.name < b.name; });
  return out;
}

absl::Status RemoveSegmentByName(const std::string& name) {
  SYMTP_RETURN_IF_ERROR(ValidateName(name));
  if (::shm_unlink(("/" + name).c_str()) != 0) {
    return Annotate(ErrnoToStatus(errno, "shm_unlink", __FILE__, __LINE__),
                    absl::StrCat("removing shm '", name, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RemoveStaleSegments(const std::string& prefix) {
  SYMTP_ASSIGN_OR_RETURN(std::vector<SegmentInfo> infos, ListSegments(prefix));
  std::vector<std::string> removed;
  std::vector<std::string> failed;
  for (const SegmentInfo& info : infos) {
    if (!info.header_valid || info.creator_alive) continue;
    absl::Status s = RemoveSegmentByName(info.name);
    if (s.ok() || s.code() == absl::StatusCode::kNotFound) {
      SYMTP_LOG(INFO, "ipc") << "removed stale shm '" << info.name << "' (creator pid "
                             << info.creator_pid << " " << ProcStateName(info.creator_state) << ")";
      if (s.ok()) removed.push_back(info.name);
    } else {
      failed.push_back(std::string(s.message()));
    }
  }
  if (!failed.empty()) {
    return absl::InternalError(absl::StrFormat("removing stale segments: %s (removed: [%s])",
                                               absl::StrJoin(failed, "; "),
                                               absl::StrJoin(removed, ", ")));
  }
  return removed;
}

}  // namespace symtp::ipc
