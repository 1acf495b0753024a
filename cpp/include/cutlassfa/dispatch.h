// The plan of one forward call and its execution (cpp/src/dispatch.cpp).
//
//   Plan plan = make_plan(backend, device, params, requested_splits);  // pure: chooses, launches nothing
//   cudaError_t err = run_plan(plan, params, stream);                  // the same params
//
// make_plan picks the kernel (the measured table's choice where it has one, cutlassfa/tuning.h; else the
// first family in the planner's order whose *_covers accepts the call, cutlassfa/launch.h), its
// instantiation (head dim, tile), the key splits (sized from that tile) and the GQA packing. run_plan
// calls only the chosen launcher; a launcher refusing a call its family covers is an internal error
// (cudaErrorInvalidValue), never a fallback to another kernel. The device is the one the call runs on
// (current when run_plan is called).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/backends.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// The kernels a plan can choose, one per family entry point of cutlassfa/launch.h.
enum class Kernel : int {
  kNaive = 0,       // simt/, launch_naive
  kSmallTile = 1,   // simt/, launch_small_tile
  kLargeTile = 2,   // simt/, launch_large_tile
  kSm80 = 3,        // sm80/, mma.sync tiles: every tensor-core call no other family covers
  kSm90 = 4,        // sm90/, wgmma tiles: the sm_90 calls neither of the next two covers
  kSm90ws = 5,      // sm90ws/, warp-specialized: dense and varlen one-pass calls
  kSm90Decode = 6,  // sm90decode/, a few query rows per K/V head against a cache
};

// The kernel's name as the planner's tests and logs spell it ("sm90ws", ...).
const char* kernel_name(Kernel kernel);

// requested_splits of make_plan: > 0 the caller's num_splits; kChooseSplits (num_splits=None) the
// planner's count; kDefaultSplits a plain call (no num_splits argument): at most 64 fp16 / bf16 queries
// (one query tile, a decode step written as a dense call) split as kChooseSplits would, anything else
// runs in one pass (fp32 included: its split-S path gains nothing from partials).
constexpr int kChooseSplits = 0;
constexpr int kDefaultSplits = -1;

struct Plan {
  Backend backend = Backend::kNaive;
  Kernel kernel = Kernel::kNaive;
  KernelTile tile;     // the kernel's instantiation for the call (empty for the CUDA-core kernels)
  int num_splits = 1;  // > 1: partials of num_splits key ranges in the workspace pool, then the combine
  bool pack_gqa = false;  // the kernel runs packed_gqa(params)
  bool tuned = false;     // kernel and splits from the measured table (cutlassfa/tuning.h)
};

// What a plan depends on in a device: queried once for a device present (plan_device), or given, to plan
// for a GPU that is not here (cutlassfa.plan).
struct PlanDevice {
  int capability = 0;  // major * 10 + minor
  int multiprocessors = 0;
  Family family = Family::kNone;  // of the tensor-core backend
};
PlanDevice plan_device(int device);

// Chooses how `backend` runs `params` on `device`; launches nothing and reads only cached device queries.
// The tensor-core backends split keys (num_splits > 1) and pack GQA decode; the CUDA-core backends run
// every call in one pass, which gives the same result up to rounding.
Plan make_plan(Backend backend, const PlanDevice& device, const FwdParams& params, int requested_splits);
inline Plan make_plan(Backend backend, int device, const FwdParams& params, int requested_splits) {
  return make_plan(backend, plan_device(device), params, requested_splits);
}

// Enqueues the plan's kernels on `stream` (on the current device) for the params make_plan was given
// (params.num_splits is ignored: the plan's count is used); returns the first CUDA error.
cudaError_t run_plan(const Plan& plan, const FwdParams& params, cudaStream_t stream);

// Decode with GQA (one query row, several query heads on each K/V head, no left window bound): the
// tensor-core backends run the heads_ratio query heads that share a K/V head as the rows of one tile
// (FlashAttention-3's PackGQA), so each K/V tile is read once per K/V head, not once per query head.
// With one query the mask does not depend on the row, so the causal / right bound is dropped.
bool packs_gqa(const FwdParams& params);
FwdParams packed_gqa(const FwdParams& params);

}  // namespace cutlassfa
