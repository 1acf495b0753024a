#include "cutlassfa/enqueue.h"

#include <cmath>
#include <cstdint>

#include "cutlassfa/dispatch.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa {

bool call_is_fill(const Problem& p) { return p.empty() || p.seqlen_k == 0; }

CallPlan plan_call(Backend backend, const PlanDevice& device, const Problem& p, const FwdParams& params,
                   const DequantizedKV& copy) {
  // num_splits=None: a call with an option chooses as kChooseSplits, a plain one as kDefaultSplits.
  int const requested = p.num_splits > 0 ? p.num_splits : p.variant ? kChooseSplits : kDefaultSplits;
  Plan const plan = make_plan(backend, device, params, requested);
  // fp8 attention (q fp8 too) reads its fp8 k and v as they are.
  if (!params.kv_fp8 || params.dtype == DType::kFloat8E4M3 || plan.kernel == Kernel::kSm90Decode) return {plan, false};
  return {make_plan(backend, device, dequantized_params(params, copy), requested), true};
}

cudaError_t enqueue_call(Backend backend, int device, const Problem& p, const FwdParams& params,
                         const AppendKV* append, const Strided4& o_view, const Strided4* lse_view,
                         cudaStream_t stream, EnqueueFailure* failure) {
  if (append != nullptr) {
    failure->step = "cutlassfa KV-cache append";
    cudaError_t const err = launch_append_kv(params, *append, stream);
    if (err != cudaSuccess) return err;
  }
  failure->step = "cutlassfa kernel launch";
  if (call_is_fill(p)) {  // no row sees a key: O = 0, lse = -inf (or the row's sink)
    cudaError_t const err = fill_device(params.o, params.out_dtype, o_view, 0.f, stream);
    if (err != cudaSuccess || lse_view == nullptr) return err;
    return fill_device(params.lse, DType::kFloat32, *lse_view, -INFINITY, stream, params.sinks);
  }
  // An fp8 cache the decode kernel does not take: the other kernels run a dequantized copy (launch.h),
  // whose plan does not depend on where the copy lies (it is 16-byte aligned wherever it is).
  PlanDevice const dev = plan_device(device);
  DequantizedKV const placeholder = dequantized_kv_in(params, reinterpret_cast<void*>(std::uintptr_t{256}));
  CallPlan const call_plan = plan_call(backend, dev, p, params, placeholder);
  if (!call_plan.dequantized) return run_plan(call_plan.plan, params, stream);
  void* buffer = nullptr;
  size_t const bytes = dequantized_kv_bytes(params);
  cudaError_t err = workspace_alloc(&buffer, bytes, stream);
  if (err != cudaSuccess) {
    failure->workspace_bytes = bytes;
    return err;
  }
  DequantizedKV const copy = dequantized_kv_in(params, buffer);
  failure->step = "cutlassfa fp8 cache dequantization";
  err = launch_dequantize_kv(params, copy, stream);
  FwdParams const copied = dequantized_params(params, copy);
  failure->step = "cutlassfa kernel launch";
  if (err == cudaSuccess) err = run_plan(call_plan.plan, copied, stream);
  cudaError_t const freed = workspace_free(buffer, stream);
  return err != cudaSuccess ? err : freed;
}

}  // namespace cutlassfa
