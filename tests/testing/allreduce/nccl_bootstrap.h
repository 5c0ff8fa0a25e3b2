// Builds an NcclComm for one rank of a group whose ranks share a PeerExchange:
// rank 0 makes the unique id, AllGather distributes it. Tests and benchmarks.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "kernels/allreduce/peer_exchange.h"
#include "kernels/nccl/nccl_comm.h"

namespace symtp::kernels::testing {

inline absl::StatusOr<std::unique_ptr<NcclComm>> NcclOverExchange(int rank, int size, int device,
                                                                  PeerExchange& ex,
                                                                  Deadline deadline) {
  struct Offer {
    int32_t ok;
    ncclUniqueId id;
  } mine{};
  if (rank == 0) {
    auto id = NcclComm::NewUniqueId();
    mine.ok = id.ok();
    if (id.ok()) mine.id = *id;
  }
  std::vector<Offer> all(size);
  SYMTP_RETURN_IF_ERROR(ex.AllGather(&mine, sizeof(mine), all.data(), deadline));
  if (!all[0].ok) return absl::InternalError("rank 0 could not make an NCCL unique id");
  return NcclComm::Create(all[0].id, rank, size, device, deadline);
}

}  // namespace symtp::kernels::testing
