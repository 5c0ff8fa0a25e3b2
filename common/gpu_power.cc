#include "common/gpu_power.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace symtp {
namespace {

// The few NVML entry points used, by their C signatures (nvml.h is not
// needed: nvmlReturn_t is an int enum, 0 = success; nvmlDevice_t a pointer).
using NvmlDevice = void*;
using InitFn = int (*)();
using ShutdownFn = int (*)();
using ErrorStringFn = const char* (*)(int);
using HandleByPciFn = int (*)(const char*, NvmlDevice*);
using ClockInfoFn = int (*)(NvmlDevice, int, unsigned*);
using PowerFn = int (*)(NvmlDevice, unsigned*);
using ReasonsFn = int (*)(NvmlDevice, unsigned long long*);
constexpr int kNvmlClockSm = 1;
constexpr int kNvmlErrorNotFound = 6;

}  // namespace

struct GpuPowerProbe::Lib {
  void* handle = nullptr;
  bool initialized = false;
  ShutdownFn shutdown = nullptr;
  ErrorStringFn error_string = nullptr;
  HandleByPciFn by_pci = nullptr;
  ClockInfoFn clock = nullptr;
  PowerFn power = nullptr, limit = nullptr;
  ReasonsFn reasons = nullptr;

  ~Lib() {
    if (initialized && shutdown) shutdown();
    if (handle) dlclose(handle);
  }
  std::string Error(const char* call, int rc) const {
    return absl::StrCat(call, " failed: ", error_string ? error_string(rc) : "", " (", rc, ")");
  }
};

GpuPowerProbe::GpuPowerProbe() = default;
GpuPowerProbe::GpuPowerProbe(GpuPowerProbe&&) noexcept = default;
GpuPowerProbe& GpuPowerProbe::operator=(GpuPowerProbe&&) noexcept = default;
GpuPowerProbe::~GpuPowerProbe() = default;

absl::StatusOr<GpuPowerProbe> GpuPowerProbe::Open(const std::string& pci_bus_id) {
  auto lib = std::make_shared<Lib>();
  lib->handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == nullptr) {
    const char* e = dlerror();
    return absl::UnavailableError(
        absl::StrCat("cannot load libnvidia-ml.so.1 (the NVIDIA driver's NVML): ", e ? e : ""));
  }
  auto sym = [&](const char* name) { return dlsym(lib->handle, name); };
  auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
  lib->shutdown = reinterpret_cast<ShutdownFn>(sym("nvmlShutdown"));
  lib->error_string = reinterpret_cast<ErrorStringFn>(sym("nvmlErrorString"));
  lib->by_pci = reinterpret_cast<HandleByPciFn>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  lib->clock = reinterpret_cast<ClockInfoFn>(sym("nvmlDeviceGetClockInfo"));
  lib->power = reinterpret_cast<PowerFn>(sym("nvmlDeviceGetPowerUsage"));
  lib->limit = reinterpret_cast<PowerFn>(sym("nvmlDeviceGetEnforcedPowerLimit"));
  // Renamed "clocks event reasons" in newer drivers; the old name stays.
  lib->reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksEventReasons"));
  if (lib->reasons == nullptr) {
    lib->reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
  }
  if (!init || !lib->shutdown || !lib->by_pci || !lib->clock || !lib->power || !lib->limit ||
      !lib->reasons) {
    return absl::UnavailableError("libnvidia-ml.so.1 lacks an NVML entry point this probe reads");
  }
  if (const int rc = init(); rc != 0) {
    return absl::UnavailableError(lib->Error("nvmlInit_v2", rc));
  }
  lib->initialized = true;
  GpuPowerProbe p;
  if (const int rc = lib->by_pci(pci_bus_id.c_str(), &p.device_); rc != 0) {
    const std::string what =
        lib->Error(absl::StrCat("nvmlDeviceGetHandleByPciBusId(", pci_bus_id, ")").c_str(), rc);
    return rc == kNvmlErrorNotFound ? absl::NotFoundError(what) : absl::UnavailableError(what);
  }
  p.lib_ = std::move(lib);
  return p;
}

absl::StatusOr<GpuPowerSample> GpuPowerProbe::Read() const {
  if (!lib_) return absl::FailedPreconditionError("GpuPowerProbe::Read on a moved-from probe");
  GpuPowerSample s;
  unsigned mw = 0, limit_mw = 0;
  unsigned long long reasons = 0;
  if (const int rc = lib_->clock(device_, kNvmlClockSm, &s.sm_clock_mhz); rc != 0) {
    return absl::UnavailableError(lib_->Error("nvmlDeviceGetClockInfo", rc));
  }
  if (const int rc = lib_->power(device_, &mw); rc != 0) {
    return absl::UnavailableError(lib_->Error("nvmlDeviceGetPowerUsage", rc));
  }
  if (const int rc = lib_->limit(device_, &limit_mw); rc != 0) {
    return absl::UnavailableError(lib_->Error("nvmlDeviceGetEnforcedPowerLimit", rc));
  }
  if (const int rc = lib_->reasons(device_, &reasons); rc != 0) {
    return absl::UnavailableError(lib_->Error("nvmlDeviceGetCurrentClocksEventReasons", rc));
  }
  s.power_w = mw / 1000.0;
  s.power_limit_w = limit_mw / 1000.0;
  s.throttle_reasons = reasons;
  return s;
}

}  // namespace symtp
