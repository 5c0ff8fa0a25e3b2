// Move-only owners of CUDA resources, built by factories that return
// absl::StatusOr instead of throwing. Destructors release quietly (errors at
// teardown are logged, never thrown). Only include from CUDA-enabled targets.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace symtp::cuda {

// Number of visible devices; 0 (not an error) when there is no driver or no
// device, so callers can skip GPU work with a reason.
int VisibleDeviceCount(std::string* why_none = nullptr);
// Whether each of the first n visible devices can access every other one
// directly (cudaDeviceCanAccessPeer, both directions). `desc` gets the
// devices' names and the pairs that cannot. Creates no context.
bool AllPeersReachable(int n, std::string* desc);

namespace internal {

// The move-only owner of one CUDA handle: `Destroy` releases it with the
// object (its error ignored); a moved-from owner holds nothing.
template <typename H, auto Destroy>
class Owner {
 public:
  Owner() = default;
  ~Owner() { Reset(); }
  Owner(Owner&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  Owner& operator=(Owner&& o) noexcept {
    if (this != &o) {
      Reset();
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  H get() const { return h_; }

 protected:
  explicit Owner(H h) : h_(h) {}

 private:
  void Reset() {
    if (h_) Destroy(h_);
  }
  H h_{};
};

// An allocation of bytes() bytes, freed by `Free`.
template <auto Free>
class Buffer : public Owner<void*, Free> {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept
      : Owner<void*, Free>(std::move(o)), bytes_(std::exchange(o.bytes_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Owner<void*, Free>::operator=(std::move(o));
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(this->get());
  }
  size_t bytes() const { return bytes_; }

 protected:
  Buffer(void* p, size_t b) : Owner<void*, Free>(p), bytes_(b) {}

 private:
  size_t bytes_ = 0;
};

// Destroys a stream, logging a failure.
cudaError_t DestroyStream(cudaStream_t s);

}  // namespace internal

class Stream : public internal::Owner<cudaStream_t, internal::DestroyStream> {
 public:
  // Non-blocking with respect to the legacy default stream.
  static absl::StatusOr<Stream> Create(int priority = 0);
  Stream() = default;

 private:
  explicit Stream(cudaStream_t s) : Owner(s) {}
};

class Event : public internal::Owner<cudaEvent_t, cudaEventDestroy> {
 public:
  // timing=false creates a cudaEventDisableTiming event (cheaper for ordering).
  static absl::StatusOr<Event> Create(bool timing = false);
  Event() = default;

 private:
  explicit Event(cudaEvent_t e) : Owner(e) {}
};

class DeviceBuffer : public internal::Buffer<cudaFree> {
 public:
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);
  DeviceBuffer() = default;

 private:
  DeviceBuffer(void* p, size_t b) : Buffer(p, b) {}
};

class PinnedBuffer : public internal::Buffer<cudaFreeHost> {
 public:
  static absl::StatusOr<PinnedBuffer> Create(size_t bytes);
  PinnedBuffer() = default;

 private:
  PinnedBuffer(void* p, size_t b) : Buffer(p, b) {}
};

// A CUDA graph (cudaGraph_t), destroyed with the object.
class Graph : public internal::Owner<cudaGraph_t, cudaGraphDestroy> {
 public:
  // What `record` enqueues on `stream`, captured in thread-local mode. When
  // `record` fails or the capture does, the capture is ended, its graph
  // discarded and the error returned (record's own status first); the
  // stream is left out of capture mode either way.
  static absl::StatusOr<Graph> Capture(cudaStream_t stream,
                                       absl::FunctionRef<absl::Status()> record);
  Graph() = default;
  absl::StatusOr<Graph> Clone() const;

 private:
  explicit Graph(cudaGraph_t g) : Owner(g) {}
};

// An instantiated CUDA graph (cudaGraphExec_t), destroyed with the object.
class GraphExec : public internal::Owner<cudaGraphExec_t, cudaGraphExecDestroy> {
 public:
  static absl::StatusOr<GraphExec> Instantiate(const Graph& graph);
  // Graph::Capture, then Instantiate.
  static absl::StatusOr<GraphExec> Capture(cudaStream_t stream,
                                           absl::FunctionRef<absl::Status()> record);
  GraphExec() = default;
  absl::Status Launch(cudaStream_t stream) const;

 private:
  explicit GraphExec(cudaGraphExec_t e) : Owner(e) {}
};

// Polls `ev` until it completes or `deadline` passes (spins, then sleeps
// 50 us): DeadlineExceeded naming `what`, or the event's CUDA error.
absl::Status WaitEvent(cudaEvent_t ev, Deadline deadline, const char* what);

// Waits for everything enqueued on `stream` so far, as WaitEvent does (an
// event recorded on the stream, polled until `deadline`).
absl::Status SyncStream(cudaStream_t stream, Deadline deadline, const char* what);

}  // namespace symtp::cuda
