// Move-only owners of CUDA resources, built by factories that return
// absl::StatusOr instead of throwing. Destructors release quietly (errors at
// teardown are logged, never thrown). Only include from CUDA-enabled targets.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

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

class Stream {
 public:
  // Non-blocking with respect to the legacy default stream.
  static absl::StatusOr<Stream> Create(int priority = 0);
  Stream() = default;
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  explicit Stream(cudaStream_t s) : s_(s) {}
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  // timing=false creates a cudaEventDisableTiming event (cheaper for ordering).
  static absl::StatusOr<Event> Create(bool timing = false);
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  explicit Event(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  DeviceBuffer(void* p, size_t b) : p_(p), bytes_(b) {}
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Create(size_t bytes);
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  PinnedBuffer(void* p, size_t b) : p_(p), bytes_(b) {}
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA graph (cudaGraph_t), destroyed with the object.
class Graph {
 public:
  // What `record` enqueues on `stream`, captured in thread-local mode. When
  // `record` fails or the capture does, the capture is ended, its graph
  // discarded and the error returned (record's own status first); the
  // stream is left out of capture mode either way.
  static absl::StatusOr<Graph> Capture(cudaStream_t stream,
                                       absl::FunctionRef<absl::Status()> record);
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  absl::StatusOr<Graph> Clone() const;
  cudaGraph_t get() const { return g_; }

 private:
  explicit Graph(cudaGraph_t g) : g_(g) {}
  cudaGraph_t g_ = nullptr;
};

// An instantiated CUDA graph (cudaGraphExec_t), destroyed with the object.
class GraphExec {
 public:
  static absl::StatusOr<GraphExec> Instantiate(const Graph& graph);
  // Graph::Capture, then Instantiate.
  static absl::StatusOr<GraphExec> Capture(cudaStream_t stream,
                                           absl::FunctionRef<absl::Status()> record);
  GraphExec() = default;
  ~GraphExec();
  GraphExec(GraphExec&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  absl::Status Launch(cudaStream_t stream) const;
  cudaGraphExec_t get() const { return e_; }

 private:
  explicit GraphExec(cudaGraphExec_t e) : e_(e) {}
  cudaGraphExec_t e_ = nullptr;
};

// Polls `ev` until it completes or `deadline` passes (spins, then sleeps
// 50 us): DeadlineExceeded naming `what`, or the event's CUDA error.
absl::Status WaitEvent(cudaEvent_t ev, Deadline deadline, const char* what);

// Waits for everything enqueued on `stream` so far, as WaitEvent does (an
// event recorded on the stream, polled until `deadline`).
absl::Status SyncStream(cudaStream_t stream, Deadline deadline, const char* what);

}  // namespace symtp::cuda
