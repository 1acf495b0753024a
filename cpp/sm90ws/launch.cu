// launch_sm90ws: what the warp-specialized Hopper kernel covers (cpp/sm90ws/launch.h), the tile of a call
// (for the planner), and the switch to the instantiation of a (dtype, head dim).
#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "cutlassfa/split_fp32.h"
#include "cutlassfa/workspace.h"
#include "sm90ws/fp8_v_transpose.h"
#include "sm90ws/head_dims.h"
#include "sm90ws/launch.h"
#include "sm90ws/launch_fwd.h"
#include "sm90ws/tile_config.h"
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

// fp32: the split pre-pass of K and V into a stream-ordered workspace (the kernel splits Q itself,
// sm90ws/split_q.h), the kernel, the release.
cudaError_t run_fp32(const FwdParams& params, cudaStream_t stream) {
  FwdParams split;
  void* workspace = nullptr;
  cudaError_t err = split_fp32_inputs(params, split, &workspace, stream, /*split_q=*/false);
  if (err != cudaSuccess) { return err; }
  err = head_dim_switch<CUTLASSFA_SM90WS_FP32_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
    return sm90ws::run_fwd<decltype(head_dim)::value, float, false>(split, stream);
  });
  cudaError_t const free_err = workspace_free(workspace, stream);
  return err != cudaSuccess ? err : free_err;
}

// fp8: the V^T pre-pass into a stream-ordered workspace (sm90ws/fp8_v_transpose.h), the kernel with O in
// out_dtype, the release.
cudaError_t run_fp8(const FwdParams& params, cudaStream_t stream) {
  FwdParams vt;
  void* workspace = nullptr;
  cudaError_t err = sm90ws::transpose_v_fp8(params, vt, &workspace, stream);
  if (err != cudaSuccess) { return err; }
  err = head_dim_switch<CUTLASSFA_SM90WS_FP8_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    return params.out_dtype == DType::kBFloat16
               ? sm90ws::run_fwd<kHeadDim, cutlass::float_e4m3_t, false, cutlass::bfloat16_t>(vt, stream)
               : sm90ws::run_fwd<kHeadDim, cutlass::float_e4m3_t, false, cutlass::half_t>(vt, stream);
  });
  cudaError_t const free_err = workspace_free(workspace, stream);
  return err != cudaSuccess ? err : free_err;
}

// What the fp8 instantiation takes beyond the TMA's rules (launch.h): dense tensors without a cache or
// splits, no score terms (sinks: the shared epilogue), O in bf16 or fp16, a listed head dim.
bool fp8_covers(const FwdParams& p) {
  bool const dense = p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.seqlens_k == nullptr &&
                     p.leftpad_k == nullptr && p.block_table == nullptr && p.num_splits <= 1;
  bool const out = p.out_dtype == DType::kBFloat16 || p.out_dtype == DType::kFloat16;
  return dense && out && !p.has_score_terms() &&
         head_dim_listed<CUTLASSFA_SM90WS_FP8_HEAD_DIMS>(p.head_dim);
}

// tile_switch at exactly the listed head dims, with the list first so that an empty one (a self-test
// build of one instantiation) is well-formed.
template <int... kHeadDims, class F>
KernelTile exact_tile(int head_dim, F&& f) {
  return tile_switch<false, kHeadDims...>(head_dim, f);
}

}  // namespace

bool sm90ws_covers(const FwdParams& p) {
  // Dense tensors, or a varlen batch (both cu_seqlens: packed q and k / v); no KV cache, no split.
  bool const packed = p.cu_seqlens_q != nullptr && p.cu_seqlens_k != nullptr;
  bool const layout = packed || (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr);
  bool const no_cache = p.seqlens_k == nullptr && p.leftpad_k == nullptr && p.block_table == nullptr &&
                        p.num_splits <= 1;
  sm90ws::TmaExtents const e = sm90ws::tma_extents(p, packed);
  bool const halves = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  // fp32: dense only; the TMA reads q itself, and k, v as the split pre-pass's contiguous fp16 rows.
  bool const fp32 = p.dtype == DType::kFloat32 && !packed;
  // fp8: q and k by TMA, v through the V^T pre-pass (16-byte rows: tensorcore_aligned).
  bool const fp8 = p.dtype == DType::kFloat8E4M3 && fp8_covers(p);
  int const eb = dtype_bytes(p.dtype);
  int const out_eb = dtype_bytes(fp8 ? p.out_dtype : p.dtype);
  bool const inputs_tma =
      tma_strides(p.q_batch_stride, p.q_head_stride, p.q_row_stride, e.batch, p.heads_q, e.rows_q, eb) &&
      (fp32 || (tma_strides(p.k_batch_stride, p.k_head_stride, p.k_row_stride, e.batch, p.heads_kv, e.rows_k, eb) &&
                (fp8 || tma_strides(p.v_batch_stride, p.v_head_stride, p.v_row_stride, e.batch, p.heads_kv, e.rows_k, eb))));
  // Softcap or ALiBi: their instantiations (dense fp16 / bf16, one of the two).
  bool const softcap = p.softcap_pre > 0.f, alibi = p.alibi_slopes != nullptr;
  bool const listed = softcap  ? halves && !packed && !alibi &&
                                    head_dim_listed<CUTLASSFA_SM90WS_SOFTCAP_HEAD_DIMS>(p.head_dim)
                      : alibi  ? halves && !packed && head_dim_listed<CUTLASSFA_SM90WS_ALIBI_HEAD_DIMS>(p.head_dim)
                      : fp32   ? head_dim_listed<CUTLASSFA_SM90WS_FP32_HEAD_DIMS>(p.head_dim)
                      : fp8    ? true  // fp8_covers
                      : packed ? head_dim_listed<CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS>(p.head_dim)
                               : head_dim_listed<CUTLASSFA_SM90WS_HEAD_DIMS>(p.head_dim);
  // Any window: the mask, the trip counts and the masked steps at either edge are common/mask.h's.
  return p.seqlen_k > 0 && layout && no_cache && (halves || fp32 || fp8) && e.rows_q > 0 &&
         e.rows_k > 0 && listed && tensorcore_aligned(p) && inputs_tma &&
         tma_strides(p.o_batch_stride, p.o_head_stride, p.o_row_stride, e.batch, p.heads_q, e.rows_q, out_eb);
}

KernelTile sm90ws_tile(const FwdParams& params) {
  auto tile = [](auto head_dim, auto config) {
    using Tile = decltype(config);  // Traits::Tile
    return KernelTile{decltype(head_dim)::value, Tile::kBlockM, Tile::kBlockN};
  };
  if (params.dtype == DType::kFloat32) {
    return exact_tile<CUTLASSFA_SM90WS_FP32_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return tile(head_dim, sm90ws::TileConfigFp32<decltype(head_dim)::value>{});
    });
  }
  if (params.dtype == DType::kFloat8E4M3) {
    return exact_tile<CUTLASSFA_SM90WS_FP8_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return tile(head_dim, sm90ws::TileConfigFp8<decltype(head_dim)::value>{});
    });
  }
  // The varlen instantiation (Traits::kVarlen) has the dense one's tile.
  return exact_tile<CUTLASSFA_SM90WS_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
    return tile(head_dim, sm90ws::TileConfig<decltype(head_dim)::value>{});
  });
}

cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream) {
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (!sm90ws_covers(params)) { return cudaErrorNotSupported; }
  if (params.dtype == DType::kFloat32) { return run_fp32(params, stream); }
  if (params.dtype == DType::kFloat8E4M3) { return run_fp8(params, stream); }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    using sm90ws::ScoreTerm;
    if (params.softcap_pre > 0.f) {  // in scope: dense, no ALiBi
      return head_dim_switch<CUTLASSFA_SM90WS_SOFTCAP_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
        return sm90ws::run_fwd<decltype(head_dim)::value, Element, false, Element, ScoreTerm::kSoftcap>(params, stream);
      });
    }
    if (params.alibi_slopes != nullptr) {  // in scope: dense
      return head_dim_switch<CUTLASSFA_SM90WS_ALIBI_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
        return sm90ws::run_fwd<decltype(head_dim)::value, Element, false, Element, ScoreTerm::kAlibi>(params, stream);
      });
    }
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
