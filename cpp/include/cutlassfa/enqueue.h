// Everything one validated call enqueues on its stream, whatever entry built it (the Python extension,
// the JAX FFI handler): the appended keys first (the kernels read them), then either the outputs of a
// call no kernel computes (no query row or no key: O = 0, lse = -inf or the row's sink) or the plan's
// kernels, on a dequantized copy of an fp8 cache when the plan is not the decode kernel (launch.h).
// cpp/src/enqueue.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cutlassfa/backends.h"
#include "cutlassfa/dispatch.h"
#include "cutlassfa/fill.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/problem.h"

namespace cutlassfa {

// Which step failed, for the caller's error message; workspace_bytes > 0 when it was a workspace
// allocation of that size.
struct EnqueueFailure {
  const char* step = "cutlassfa kernel launch";
  size_t workspace_bytes = 0;
};

// The plan of a call's kernels (when it has any: a call no row of which sees a key is a fill): for an fp8
// cache the decode kernel does not take, the plan on its dequantized copy (`dequantized`), whose params
// dequantized_params(params, copy) give at any 16-byte aligned copy.
struct CallPlan {
  Plan plan;
  bool dequantized = false;
};
bool call_is_fill(const Problem& problem);
CallPlan plan_call(Backend backend, const PlanDevice& device, const Problem& problem, const FwdParams& params,
                   const DequantizedKV& copy);

// `params` is make_params(problem, ...) on the call's device (current); `append` nullptr when no keys
// are appended; o_view (B, H, N, d) and lse_view (B, H, N, 1) (nullptr: not asked for) locate the
// outputs for the fill. Returns the first CUDA error, with `failure` saying where.
cudaError_t enqueue_call(Backend backend, int device, const Problem& problem, const FwdParams& params,
                         const AppendKV* append, const Strided4& o_view, const Strided4* lse_view,
                         cudaStream_t stream, EnqueueFailure* failure);

}  // namespace cutlassfa
