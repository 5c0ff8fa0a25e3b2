// GpuPowerProbe: a GPU's SM clock, power draw and throttle reasons, read
// through NVML (libnvidia-ml.so.1, loaded at run time: nothing links against
// it, and where the driver is absent Open is an error, not a build failure).
//
// For measurements that depend on the power state: an H200 decoding at
// batch 256 sits at its 700 W cap, so code that finishes the same work
// sooner lowers the clock for everything (bench/results/h200-2026-11-24,
// run aw), and a comparison that alternates two variants step by step sees
// both at one clock.
//
// Thread-compatible; a Read is a few NVML calls (tens of microseconds).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace symtp {

struct GpuPowerSample {
  unsigned sm_clock_mhz = 0;
  double power_w = 0;             // current draw
  double power_limit_w = 0;       // the enforced limit
  uint64_t throttle_reasons = 0;  // NVML's clocks-event / throttle-reason bits
  // The software power cap is holding the clock down (NVML bit 0x4).
  bool power_capped() const { return (throttle_reasons & 0x4) != 0; }
};

class GpuPowerProbe {
 public:
  // The device with this PCI bus id ("0000:17:00.0", as cudaDeviceGetPCIBusId
  // writes it). Unavailable when NVML cannot be loaded or initialized, NotFound
  // for an unknown bus id; messages name the library call.
  static absl::StatusOr<GpuPowerProbe> Open(const std::string& pci_bus_id);

  GpuPowerProbe(GpuPowerProbe&&) noexcept;
  GpuPowerProbe& operator=(GpuPowerProbe&&) noexcept;
  ~GpuPowerProbe();

  absl::StatusOr<GpuPowerSample> Read() const;

  struct Lib;  // implementation detail

 private:
  GpuPowerProbe();
  std::shared_ptr<Lib> lib_;
  void* device_ = nullptr;  // nvmlDevice_t
};

}  // namespace symtp
