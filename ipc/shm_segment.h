// One POSIX shared-memory segment per job: creation, attachment, named
// sub-regions, and cleanup on every exit path.
//
// Layout of a segment (all offsets from the mapping's base):
//
//   [0, 4096)        SegmentHeader: magic, layout version, creator pid and start
//                    time, creation wall-clock time, total size, region table
//   [4096, size)     regions, each 4096-aligned, carved by the creator with
//                    Allocate() and looked up by name with Find()
//
// Lifetime. The process that Create()s a segment owns its *name*: the name is
// unlinked when the ShmSegment is destroyed or Remove()d, at normal process
// exit (atexit), and on SIGINT / SIGTERM (an async-signal-safe handler unlinks
// /dev/shm/<name> of every segment this process created, then hands the signal
// to the handler that was installed before it, or re-raises it with the
// default action). Every Create() re-checks the handlers: if the program
// installed its own since, the cleanup handler is put in front of it again
// (a handler that chains back to ours is safe: re-entry does not loop). An
// ignored signal stays ignored. Mappings outlive the name: processes
// that have attached keep using the memory after it is unlinked. A creator
// killed by SIGKILL leaves its segment behind unless it arranged otherwise
// (symtp's launcher does: runtime/launcher.cc's segment guard);
// ListSegments() reports such a segment with creator_alive == false and
// RemoveStaleSegments() (or `symtp_shm clean`) removes it.
//
// Attaching processes validate the header (magic, layout version, size): a
// name that exists but is not a symtp segment of this layout is
// FailedPrecondition, never a crash.
//
// Thread safety: Allocate() is serialized within the creating process; Find()
// may run concurrently with Allocate() in any process (the region count is
// published with release after the entry is written).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "ipc/liveness.h"

namespace symtp::ipc {

namespace internal {
struct SegmentHeader;
}  // namespace internal

// What ListSegments() knows about one /dev/shm entry.
struct SegmentInfo {
  std::string name;
  pid_t creator_pid = 0;        // 0 if the header could not be read
  bool creator_alive = false;   // creator exists (alive or stopped) and is the same process
  size_t bytes = 0;             // size of the shm object
  int64_t created_unix_ns = 0;  // from the header; the file's mtime if the header is invalid
  // Additions: why the entry is what it is.
  bool header_valid = false;  // magic, version and size check out
  ProcState creator_state = ProcState::kDead;
  std::string problem;  // empty when header_valid; else e.g. "bad magic"
};

class ShmSegment {
 public:
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kRegionAlignment = 4096;
  static constexpr size_t kMaxRegions = 32;
  static constexpr size_t kMaxRegionNameLength = 31;
  static constexpr uint32_t kLayoutVersion = 1;
  static constexpr uint64_t kMagic = 0x314D485350545953ull;  // "SYTPSHM1" little-endian

  // A name for a new job's segment: env::ShmPrefix() + "_" + 16 random hex chars.
  static std::string NewJobName();

  // Bytes a region of `bytes` occupies in a segment (rounded up to
  // kRegionAlignment). Create(name, sum of RegionFootprint(...)) always has
  // room for those regions.
  static size_t RegionFootprint(size_t bytes);

  // Creates /dev/shm/<name> (O_CREAT|O_EXCL, mode 0600) with `bytes` of room
  // for regions (the mapping is kHeaderBytes + RegionFootprint(bytes)), maps
  // it, writes the header and registers the name for cleanup (see above).
  // Errors: AlreadyExists if the name exists; InvalidArgument for a bad name
  // (allowed: [A-Za-z0-9._-], 1..200 chars, not starting with '.');
  // ResourceExhausted (naming the size and /dev/shm's free space) when
  // /dev/shm cannot hold it: every page is reserved here (posix_fallocate),
  // so a shortage is this error, never a SIGBUS in a process that touches
  // the memory later.
  static absl::StatusOr<ShmSegment> Create(const std::string& name, size_t bytes);

  // Maps an existing segment read-write. NotFound if it does not exist;
  // FailedPrecondition for a wrong magic, layout version or size (including a
  // segment whose creator has not finished writing its header).
  static absl::StatusOr<ShmSegment> Attach(const std::string& name);

  // Attach(), retried every millisecond while the segment does not exist yet
  // or its header is not written yet, until `deadline`. Other errors return
  // at once. For processes started concurrently with the creator.
  static absl::StatusOr<ShmSegment> Attach(const std::string& name, Deadline deadline);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // Unmaps; the creator (in the creating process) also unlinks the name.
  ~ShmSegment();

  // Carves a named region of `bytes` (creator only), kRegionAlignment-aligned
  // and zero-filled (fresh memory; no page is touched by Allocate). InvalidArgument for an empty
  // name or one longer than kMaxRegionNameLength; AlreadyExists for a duplicate name;
  // ResourceExhausted when the segment or the region table (kMaxRegions) is
  // full; FailedPrecondition when called by a process that only attached.
  absl::StatusOr<void*> Allocate(absl::string_view region, size_t bytes);

  // Looks a region up by name: {address, bytes as allocated}. NotFound names
  // the region and lists the regions that exist.
  absl::StatusOr<std::pair<void*, size_t>> Find(absl::string_view region) const;

  void* base() const;         // the mapping (the header is at offset 0)
  size_t size() const;        // the whole mapping, header included
  size_t bytes_free() const;  // room left for regions
  const std::string& name() const { return name_; }
  bool is_creator() const;    // created by this object, in this process
  pid_t creator_pid() const;  // from the header

  // Creator: unlinks the name now (idempotent; the mapping stays valid).
  // FailedPrecondition for an attached (non-creator) segment.
  absl::Status Remove();

 private:
  struct Mapping;
  ShmSegment(std::string name, std::unique_ptr<Mapping> mapping, pid_t owner_pid);
  // Attach(); *retryable says whether the failure may go away (the segment
  // does not exist yet or its creator has not finished the header).
  static absl::StatusOr<ShmSegment> AttachInternal(const std::string& name, bool* retryable);
  internal::SegmentHeader* header() const;

  std::string name_;
  std::unique_ptr<Mapping> mapping_;
  pid_t owner_pid_ = 0;  // getpid() of the creator if this object created the name, else 0
  bool removed_ = false;
  int cleanup_slot_ = -1;  // index in the process's signal/exit cleanup registry
};

// Every /dev/shm entry whose name starts with `prefix`, with its header read
// (without mapping it) and its creator probed. Entries that cannot be read or
// do not carry a valid header are listed with header_valid == false.
absl::StatusOr<std::vector<SegmentInfo>> ListSegments(const std::string& prefix);

// Removes the segments under `prefix` whose header is valid and whose creator
// is dead (gone, zombie, or its pid recycled). Segments without a valid header
// are left alone (they may be mid-creation, or not ours): remove those with
// RemoveSegmentByName(). Returns the names removed; if some unlink failed, an
// error that names them (and the ones that were removed).
absl::StatusOr<std::vector<std::string>> RemoveStaleSegments(const std::string& prefix);

// Unlinks /dev/shm/<name> whatever its state. NotFound if it does not exist.
absl::Status RemoveSegmentByName(const std::string& name);

}  // namespace symtp::ipc
