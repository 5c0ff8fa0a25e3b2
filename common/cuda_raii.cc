#include "common/cuda_raii.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace symtp::cuda {

int VisibleDeviceCount(std::string* why_none) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_none) *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why_none) *why_none = "no CUDA device visible";
  return n;
}

bool AllPeersReachable(int n, std::string* desc) {
  bool ok = true;
  std::string names, missing;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      names += (i ? ", " : "") + std::to_string(i) + ": " + prop.name;
    }
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess || !can) {
        cudaGetLastError();
        ok = false;
        missing += (missing.empty() ? "" : ", ") + std::to_string(i) + "->" + std::to_string(j);
      }
    }
  }
  if (desc) {
    *desc = "GPUs [" + names + "]; peer access " +
            (ok ? std::string("between every pair") : "missing for " + missing);
  }
  return ok;
}

namespace internal {
cudaError_t DestroyStream(cudaStream_t s) {
  const cudaError_t e = cudaStreamDestroy(s);
  if (e != cudaSuccess) SYMTP_LOG(WARN, "cuda") << "cudaStreamDestroy failed";
  return e;
}
}  // namespace internal

absl::StatusOr<Stream> Stream::Create(int priority) {
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return Stream(s);
}

absl::StatusOr<Event> Event::Create(bool timing) {
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(e);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceBuffer(p, bytes);
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return PinnedBuffer(p, bytes);
}

absl::StatusOr<Graph> Graph::Capture(cudaStream_t stream,
                                     absl::FunctionRef<absl::Status()> record) {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status st = record();
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &g);
  if (!st.ok() || end != cudaSuccess) {
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
    if (!st.ok()) return st;
    return CudaErrorToStatus(end, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  return Graph(g);
}
absl::StatusOr<Graph> Graph::Clone() const {
  cudaGraph_t g = nullptr;
  CUDA_RETURN_IF_ERROR(cudaGraphClone(&g, get()));
  return Graph(g);
}

absl::StatusOr<GraphExec> GraphExec::Instantiate(const Graph& graph) {
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, graph.get(), 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaErrorToStatus(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return GraphExec(e);
}
absl::StatusOr<GraphExec> GraphExec::Capture(cudaStream_t stream,
                                             absl::FunctionRef<absl::Status()> record) {
  absl::StatusOr<Graph> g = Graph::Capture(stream, record);
  if (!g.ok()) return g.status();
  return Instantiate(*g);
}
absl::Status GraphExec::Launch(cudaStream_t stream) const {
  return CUDA_STATUS(cudaGraphLaunch(get(), stream));
}

absl::Status SyncStream(cudaStream_t stream, Deadline deadline, const char* what) {
  SYMTP_ASSIGN_OR_RETURN(Event ev, Event::Create(/*timing=*/false));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.get(), stream));
  return WaitEvent(ev.get(), deadline, what);
}

absl::Status WaitEvent(cudaEvent_t ev, Deadline deadline, const char* what) {
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return Annotate(CudaErrorToStatus(e, "cudaEventQuery", __FILE__, __LINE__), what);
    }
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": the GPU did not finish in time"));
    }
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace symtp::cuda
