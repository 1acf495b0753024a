// Backends, the tensor-core family each device runs, and which backend can run where. Every
// availability decision is made here, once (cpp/src/devices.cpp), and reported to Python. Free of
// CUDA types, so the validator compiles in a build without the CUDA toolkit (cpp/src/devices_none.cpp).
#pragma once

#include <string>

#include "cutlassfa/params.h"

namespace cutlassfa {

// kTensorCore is the fastest tensor-core kernel for the device (see Family); kTensorCoreSm80 is always
// the mma.sync kernel, for comparison and testing.
enum class Backend : int { kNaive = 0, kSmallTile = 1, kLargeTile = 2, kTensorCore = 3, kTensorCoreSm80 = 4 };

// The tensor-core kernel family `kTensorCore` runs on a device: Hopper warpgroup MMA when the device
// is compute capability 9.0 and the extension carries sm_90a code (for the head dims of
// CUTLASSFA_SM90_HEAD_DIMS), mma.sync on other sm_80+ devices.
enum class Family : int { kNone = 0, kMmaSync = 1, kWgmma = 2 };

// Number of usable CUDA devices; when zero, *reason says why (no driver, no device, no CUDA build).
int device_count(std::string* reason);

// Compute capability (major * 10 + minor) and multiprocessors of `device`, queried once and cached;
// 0 when the device cannot be queried.
int device_capability(int device);
int device_multiprocessors(int device);

Family tensorcore_family(int device);

// Empty when `backend` can run on `device`; otherwise why not (no device, too old, not compiled).
std::string backend_unavailable_reason(Backend backend, int device);

// The same two answers for a device of compute capability `capability` that need not be present (what this
// build's kernels would do there: cutlassfa.plan for another GPU).
Family tensorcore_family_for(int capability);
std::string backend_unavailable_for(Backend backend, int capability);

// Prefix of a refusal that is a backend's documented limit (a size its design cannot take), not a gap.
inline constexpr const char* kLimitPrefix = "limit: ";

// The backend's name as Python spells it ("naive", ..., "tensorcore_sm80").
const char* backend_name(Backend backend);

// Why this build's kernels do not run `head_dim` with `dtype` on `backend`; empty when they do. Every
// multiple of 8 up to a family's widest compiled kernel runs (on the next compiled width of the lists
// in cutlassfa/config.h, zero-padded; naive takes any). Documented limits start with kLimitPrefix:
// small_tile above its 48 KB tiles, tensor-core fp32 above CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM.
std::string head_dim_refusal(Backend backend, int head_dim, DType dtype);
bool head_dim_runs(Backend backend, int head_dim, DType dtype);

// True when the wgmma family runs `head_dim` (up to the widest of CUTLASSFA_SM90_HEAD_DIMS, above half
// the narrowest); the narrower head dims of `tensorcore` run on mma.sync even on sm_90.
bool wgmma_head_dim(int head_dim);

}  // namespace cutlassfa
