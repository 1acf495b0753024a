// launch_sm90ws: what the warp-specialized Hopper kernel covers (cpp/sm90ws/launch.h), and the switch to
// the instantiation of a (dtype, head dim).
#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "sm90ws/head_dims.h"
#include "sm90ws/launch.h"
#include "sm90ws/launch_fwd.h"
#include "sm90ws/tma_extents.h"

namespace cutlassfa {

namespace {

// TMA takes positive strides below 2^40 bytes (16-byte multiples: tensorcore_aligned); a stride over an
// extent of 1 is never applied and not checked.
bool tma_strides(long long batch_stride, long long head_stride, long long row_stride, int batch, int heads, int rows,
                 int elem_bytes) {
  auto ok = [elem_bytes](long long stride, int extent) {
    return extent <= 1 || (stride > 0 && stride * elem_bytes < (1ll << 40));
  };
  return ok(batch_stride, batch) && ok(head_stride, heads) && ok(row_stride, rows);
}

bool in_scope(const FwdParams& p) {
  // Dense tensors, or a varlen batch (both cu_seqlens: packed q and k / v); no KV cache, no split.
  bool const packed = p.cu_seqlens_q != nullptr && p.cu_seqlens_k != nullptr;
  bool const layout = packed || (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr);
  bool const no_cache = p.seqlens_k == nullptr && p.leftpad_k == nullptr && p.block_table == nullptr &&
                        p.num_splits <= 1;
  sm90ws::TmaExtents const e = sm90ws::tma_extents(p, packed);
  bool const halves = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  int const eb = 2;
  // Any window: the mask, the trip counts and the masked steps at either edge are common/mask.h's.
  return layout && no_cache && halves && p.softcap_pre == 0.f && e.rows_q > 0 && e.rows_k > 0 &&
         (packed ? head_dim_listed<CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS>(p.head_dim)
                 : head_dim_listed<CUTLASSFA_SM90WS_HEAD_DIMS>(p.head_dim)) &&
         tensorcore_aligned(p) &&
         tma_strides(p.q_batch_stride, p.q_head_stride, p.q_row_stride, e.batch, p.heads_q, e.rows_q, eb) &&
         tma_strides(p.k_batch_stride, p.k_head_stride, p.k_row_stride, e.batch, p.heads_kv, e.rows_k, eb) &&
         tma_strides(p.v_batch_stride, p.v_head_stride, p.v_row_stride, e.batch, p.heads_kv, e.rows_k, eb) &&
         tma_strides(p.o_batch_stride, p.o_head_stride, p.o_row_stride, e.batch, p.heads_q, e.rows_q, eb);
}

}  // namespace

cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream) {
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (params.seqlen_k <= 0 || !in_scope(params)) { return cudaErrorNotSupported; }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    if (params.cu_seqlens_q != nullptr) {  // in scope: both cu_seqlens
      return head_dim_switch<CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
        return sm90ws::run_fwd<decltype(head_dim)::value, Element, true>(params, stream);
      });
    }
    return head_dim_switch<CUTLASSFA_SM90WS_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return sm90ws::run_fwd<decltype(head_dim)::value, Element, false>(params, stream);
    });
  });
}

}  // namespace cutlassfa
