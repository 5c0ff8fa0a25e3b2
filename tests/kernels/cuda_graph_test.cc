// cuda::Graph / cuda::GraphExec (common/cuda_raii.h): a capture replays what
// was recorded, a clone replays the same, and a failed record ends the
// capture, returns its own error and leaves the stream usable with nothing of
// the recording run.
#include <cstdint>
#include <vector>

#include "common/cuda_raii.h"
#include "tests/kernels/gpu_test_util.h"

namespace symtp {
namespace {

class CudaGraphTest : public kernels::testing::GpuTest {
 protected:
  static constexpr size_t kBytes = 4096;

  void SetUp() override {
    kernels::testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    auto b = cuda::DeviceBuffer::Create(kBytes);
    ASSERT_TRUE(b.ok()) << b.status();
    buf_ = std::move(*b);
  }

  // Sets every byte of the buffer to `v` (eagerly) and waits.
  void Fill(int v) {
    ASSERT_EQ(cudaMemsetAsync(buf_.get(), v, kBytes, stream()), cudaSuccess);
    Sync();
  }

  // Whether every byte of the buffer is `v`.
  bool AllBytes(int v) {
    std::vector<uint8_t> h(kBytes);
    EXPECT_EQ(cudaMemcpy(h.data(), buf_.get(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint8_t b : h) {
      if (b != static_cast<uint8_t>(v)) return false;
    }
    return true;
  }

  cuda::DeviceBuffer buf_;
};

TEST_F(CudaGraphTest, ReplaysWhatWasRecordedAndClonesReplayTheSame) {
  Fill(0);
  absl::StatusOr<cuda::Graph> graph = cuda::Graph::Capture(stream(), [&]() -> absl::Status {
    if (cudaMemsetAsync(buf_.get(), 0x5a, kBytes, stream()) != cudaSuccess) {
      return absl::InternalError("memset");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  // Recording ran nothing.
  EXPECT_TRUE(AllBytes(0));
  absl::StatusOr<cuda::GraphExec> exec = cuda::GraphExec::Instantiate(*graph);
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (int replay = 0; replay < 2; ++replay) {
    Fill(0);
    ASSERT_TRUE(exec->Launch(stream()).ok());
    Sync();
    EXPECT_TRUE(AllBytes(0x5a)) << "replay " << replay;
  }
  absl::StatusOr<cuda::Graph> clone = graph->Clone();
  ASSERT_TRUE(clone.ok()) << clone.status();
  absl::StatusOr<cuda::GraphExec> clone_exec = cuda::GraphExec::Instantiate(*clone);
  ASSERT_TRUE(clone_exec.ok()) << clone_exec.status();
  Fill(0);
  ASSERT_TRUE(clone_exec->Launch(stream()).ok());
  Sync();
  EXPECT_TRUE(AllBytes(0x5a));
  // Moving hands the graph over; the moved-from owner is empty.
  cuda::GraphExec moved = std::move(*exec);
  EXPECT_EQ(exec->get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
}

TEST_F(CudaGraphTest, FailedRecordEndsTheCaptureAndReturnsItsError) {
  Fill(1);
  absl::StatusOr<cuda::GraphExec> exec = cuda::GraphExec::Capture(stream(), [&]() -> absl::Status {
    if (cudaMemsetAsync(buf_.get(), 0x77, kBytes, stream()) != cudaSuccess) {
      return absl::InternalError("memset");
    }
    return absl::FailedPreconditionError("recording stopped here");
  });
  ASSERT_FALSE(exec.ok());
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(exec.status().message(), "recording stopped here");
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(stream(), &capturing), cudaSuccess);
  EXPECT_EQ(capturing, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // The stream works and the recorded memset never ran.
  Sync();
  EXPECT_TRUE(AllBytes(1));
  Fill(2);
  EXPECT_TRUE(AllBytes(2));
}

TEST_F(CudaGraphTest, IllegalWorkDuringCaptureIsAnError) {
  // A synchronous copy to the host is not capturable: the capture fails
  // (invalidated), and the stream leaves capture mode.
  std::vector<uint8_t> h(kBytes);
  absl::StatusOr<cuda::Graph> graph = cuda::Graph::Capture(stream(), [&]() -> absl::Status {
    (void)cudaMemcpyAsync(h.data(), buf_.get(), kBytes, cudaMemcpyDeviceToHost, stream());
    (void)cudaStreamSynchronize(stream());
    return absl::OkStatus();
  });
  EXPECT_FALSE(graph.ok());
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(stream(), &capturing), cudaSuccess);
  EXPECT_EQ(capturing, cudaStreamCaptureStatusNone);
  Fill(3);
  EXPECT_TRUE(AllBytes(3));
}

}  // namespace
}  // namespace symtp
