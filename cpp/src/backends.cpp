// Device queries made once per device and cached, and the backend availability rules: which backend
// runs where, which head dims it has kernels for, and which tensor-core family `tensorcore` picks.
// Built without the CUDA toolkit (CUTLASSFA_HAS_CUDA 0) it reports no device, with the reason.
#include <dlfcn.h>

#include <initializer_list>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "cutlassfa/config.h"
#if CUTLASSFA_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include "cutlassfa/backends.h"

namespace cutlassfa {
namespace {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int capability = 0;  // major * 10 + minor
  int multiprocessors = 0;
};

struct Cache {
  std::mutex mutex;
  std::array<DeviceInfo, kMaxDevices> info{};
  std::array<bool, kMaxDevices> known{};
};

Cache& cache() {
  static Cache instance;
  return instance;
}

// Whether machine code built for the comma-separated `architectures` (e.g. "80,86,90a") runs on a
// device of `capability`: sm_XY runs on the same major with minor >= Y; sm_90a only on 9.0.
bool has_image(const char* architectures, int capability) {
  std::string const list = std::string(architectures) + ",";
  for (size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1) {
    std::string const arch = list.substr(start, comma - start);
    if (arch.empty()) continue;
    bool const specific = arch.back() == 'a';
    int const number = std::stoi(specific ? arch.substr(0, arch.size() - 1) : arch);
    if (specific ? number == capability : (number / 10 == capability / 10 && number <= capability)) return true;
  }
  return false;
}

int min_capability(Backend backend) {
  switch (backend) {
    case Backend::kNaive:
    case Backend::kSmallTile: return 61;
    case Backend::kLargeTile:  // opt-in shared memory beyond 99 KB per block
    case Backend::kTensorCore:
    case Backend::kTensorCoreSm80: return 80;  // mma.sync m16n8k16 and cp.async
  }
  return 1000;
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kNaive: return "naive";
    case Backend::kSmallTile: return "small_tile";
    case Backend::kLargeTile: return "large_tile";
    case Backend::kTensorCore: return "tensorcore";
    case Backend::kTensorCoreSm80: return "tensorcore_sm80";
  }
  return "unknown";
}

namespace {

bool is_tensorcore(Backend backend) { return backend == Backend::kTensorCore || backend == Backend::kTensorCoreSm80; }

// Why no device can be used. A machine without any NVIDIA driver makes the runtime report "driver
// version is insufficient", which would send users to upgrade a driver they do not have.
#if CUTLASSFA_HAS_CUDA
std::string no_device_reason(cudaError_t status, int count) {
  if (status == cudaSuccess) return count == 0 ? "no CUDA device" : "";
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver == nullptr) return "no NVIDIA driver found (libcuda.so.1 cannot be loaded)";
  dlclose(driver);
  return std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
}
#endif


// Queried once per device, then served from the cache (a tiny call's budget is a few microseconds).
const DeviceInfo& device_info(int device) {
  static DeviceInfo const unknown{};
  if (device < 0 || device >= kMaxDevices) return unknown;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.known[device]) {
#if CUTLASSFA_HAS_CUDA
    int major = 0, minor = 0, sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return unknown;
    }
    c.info[device] = DeviceInfo{10 * major + minor, sms};
#endif
    c.known[device] = true;
  }
  return c.info[device];
}

// The device count and, when zero, why: asked once.
struct Devices {
  int count = 0;
  std::string reason;
};

const Devices& devices() {
  static Devices const result = [] {
    Devices d;
#if CUTLASSFA_HAS_CUDA
    cudaError_t const status = cudaGetDeviceCount(&d.count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      d.count = 0;
    }
    d.reason = no_device_reason(status, d.count);
#else
    d.reason = "cutlassfa was installed without its CUDA extension (no CUDA toolkit at build time)";
#endif
    return d;
  }();
  return result;
}

}  // namespace

int device_count(std::string* reason) {
  if (reason != nullptr) *reason = devices().reason;
  return devices().count;
}

int device_capability(int device) { return device_info(device).capability; }

int device_multiprocessors(int device) { return device_info(device).multiprocessors; }

Family tensorcore_family(int device) {
  static std::array<std::atomic<int>, kMaxDevices> cached{};  // Family + 1; 0 = not yet known
  if (device >= 0 && device < kMaxDevices) {
    int const known = cached[device].load(std::memory_order_relaxed);
    if (known != 0) return static_cast<Family>(known - 1);
  }
  Family const family = backend_unavailable_reason(Backend::kTensorCore, device).empty()
                            ? tensorcore_family_for(device_capability(device)) : Family::kNone;
  if (device >= 0 && device < kMaxDevices) cached[device].store(static_cast<int>(family) + 1, std::memory_order_relaxed);
  return family;
}

std::string head_dim_refusal(Backend backend, int head_dim, DType dtype) {
  if (head_dim < 8 || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    return "head dim " + std::to_string(head_dim) + " is not a multiple of 8 from 8 to " + std::to_string(kMaxHeadDim);
  }
  if (!CUTLASSFA_HAS_CUDA || (is_tensorcore(backend) && !CUTLASSFA_HAS_SM80)) {
    return "this build has no kernels for this backend";
  }
  // Every multiple of 8 up to a family's widest compiled kernel runs on the next compiled width, zero-padded.
  auto widest = [](std::initializer_list<int> dims) { return std::max(dims); };
  switch (backend) {
    case Backend::kNaive: return "";  // no compiled width: any head dim
    case Backend::kSmallTile:
      if (head_dim <= widest({CUTLASSFA_SMALL_TILE_HEAD_DIMS})) return "";
      return std::string(kLimitPrefix) + "small_tile keeps a block's tiles within 48 KB of shared memory (the sm_61 "
             "limit), which holds head dims up to " + std::to_string(widest({CUTLASSFA_SMALL_TILE_HEAD_DIMS})) +
             ", not " + std::to_string(head_dim) + "; large_tile and naive take it";
    case Backend::kLargeTile:
      if (head_dim <= widest({CUTLASSFA_LARGE_TILE_HEAD_DIMS})) return "";
      break;
    case Backend::kTensorCore:
    case Backend::kTensorCoreSm80:
      if (dtype == DType::kFloat32 && head_dim > CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) {
        return std::string(kLimitPrefix) + backend_name(backend) + " runs fp32 (split-fp16 products) up to head dim " +
               std::to_string(CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) + ", not " + std::to_string(head_dim) +
               ": the split tiles outgrow shared memory";
      }
      if (head_dim <= widest({CUTLASSFA_SM80_HEAD_DIMS})) return "";
      break;
  }
  return std::string(backend_name(backend)) + " has no kernels for head dim " + std::to_string(head_dim) +
         " in this build";
}

bool head_dim_runs(Backend backend, int head_dim, DType dtype) {
  return head_dim_refusal(backend, head_dim, dtype).empty();
}

// Computed once per (backend, device): forward() asks on every call.
std::string compute_unavailable_reason(Backend backend, int device) {
  int const count = devices().count;
  if (count == 0) return devices().reason;
  if (device < 0 || device >= count) {
    return "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)";
  }
  int const capability = device_capability(device);
  if (capability == 0) return "cannot query CUDA device " + std::to_string(device);
  std::string const reason = backend_unavailable_for(backend, capability);
  return reason.empty() ? reason : "device " + std::to_string(device) + ": " + reason;
}

std::string backend_unavailable_for(Backend backend, int capability) {
  auto version = [](int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); };
  if (capability < min_capability(backend)) {
    return "needs compute capability >= " + version(min_capability(backend)) + ", not " + version(capability);
  }
  const char* architectures = is_tensorcore(backend) ? CUTLASSFA_SM80_ARCHITECTURES : CUTLASSFA_ARCHITECTURES;
  if (!CUTLASSFA_HAS_CUDA || !has_image(architectures, capability)) {
    return "not compiled for sm_" + std::to_string(capability) + " (built for: " +
           (architectures[0] != '\0' ? architectures : "none") + ")";
  }
  return "";
}

Family tensorcore_family_for(int capability) {
  if (!backend_unavailable_for(Backend::kTensorCore, capability).empty()) return Family::kNone;
  return capability == 90 && has_image(CUTLASSFA_SM90_ARCHITECTURES, 90) ? Family::kWgmma : Family::kMmaSync;
}

// Head dims the wgmma family runs (zero-padded to the next compiled width); narrower ones (d <= 32) run
// on mma.sync's d = 32 kernel.
bool wgmma_head_dim(int head_dim) {
  return CUTLASSFA_HAS_SM90 && head_dim > std::min({CUTLASSFA_SM90_HEAD_DIMS}) / 2 &&
         head_dim <= std::max({CUTLASSFA_SM90_HEAD_DIMS});
}

std::string backend_unavailable_reason(Backend backend, int device) {
  constexpr int kBackends = 5;
  static std::mutex mutex;
  static std::array<std::array<std::string, kBackends>, kMaxDevices> reasons;
  static std::array<std::array<bool, kBackends>, kMaxDevices> known{};
  int const b = static_cast<int>(backend);
  if (device < 0 || device >= kMaxDevices || b < 0 || b >= kBackends) return compute_unavailable_reason(backend, device);
  std::lock_guard<std::mutex> lock(mutex);
  if (!known[device][b]) {
    reasons[device][b] = compute_unavailable_reason(backend, device);
    known[device][b] = true;
  }
  return reasons[device][b];
}

}  // namespace cutlassfa
