// launch_sm90_decode: what the decode kernel (cpp/sm90decode/decode_kernel.h) covers, its tile, and its
// launch. Its few instantiations (fp16 / bf16 q x fp16 / bf16 or fp8 caches x CUTLASSFA_SM90_DECODE_HEAD_DIMS
// x 16 / 32 rows a CTA x plain / general) compile here, in one object.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/launch_kernel.h"
#include "common/static_switch.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/config.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "sm90decode/decode_kernel.h"

namespace cutlassfa {

namespace {

bool one_slab(const FwdParams& params) { return static_cast<long long>(params.seqlen_q) * params.heads_ratio <= 16; }

// The general instantiation: left padding, a left window bound or softcap.
bool general(const FwdParams& params) {
  return params.leftpad_k != nullptr || params.window_left >= 0 || params.softcap_pre > 0.f;
}

// f(Traits{}) for the instantiation that runs `params` at head dim kHeadDim (q of Element); `none` where none
// does (an fp8 cache at d = 256). Query rows a CTA: one m16n8k16 slab (16 rows) when the K/V head has no more,
// else two (kSm90DecodeRows) in as many chunks as its rows need; d = 256: one slab, its only instantiation.
template <class Element, int kHeadDim, class R, class F>
R at_head_dim(const FwdParams& params, R none, F&& f) {
  return bool_switch(params.kv_fp8, [&](auto fp8) {
    return bool_switch(general(params), [&](auto general_modes) -> R {
      constexpr bool kFp8 = decltype(fp8)::value, kGeneral = decltype(general_modes)::value;
      if constexpr (kHeadDim > kSm90DecodeFourWarpHeadDim) {  // one slab, no fp8 (sm90_decode_covers)
        if constexpr (kFp8) {
          return none;
        } else {
          return f(sm90decode::DecodeTraits<kHeadDim, Element, 16, false, kGeneral>{});
        }
      } else if (one_slab(params)) {
        return f(sm90decode::DecodeTraits<kHeadDim, Element, 16, kFp8, kGeneral>{});
      } else {
        return f(sm90decode::DecodeTraits<kHeadDim, Element, kSm90DecodeRows, kFp8, kGeneral>{});
      }
    });
  });
}

// The decode kernel's instantiation for a call, in one place for its launch and its tile: f(Traits{}), or
// `none` where there is none (an unlisted head dim, an fp8 cache at d = 256).
template <class Element, int... kHeadDims, class R, class F>
R with_decode_traits(const FwdParams& params, R none, F&& f) {
  return head_dim_fold<false, kHeadDims...>(params.head_dim, none, [&](auto head_dim) {
    return at_head_dim<Element, decltype(head_dim)::value>(params, none, f);
  });
}

template <class Traits>
cudaError_t run_decode(const FwdParams& params, cudaStream_t stream) {
  constexpr int kRows = Traits::kRows;
  static_assert(Traits::kCtasPerSm == kSm90DecodeCtasPerSm, "the split heuristic's CTAs a multiprocessor");
  auto kernel = &sm90decode::decode_kernel<Traits>;
  if constexpr (Traits::kSmemSize > 48 * 1024) {
    cudaError_t const err = opt_in_shared_memory(kernel, Traits::kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  long long const rows = static_cast<long long>(params.seqlen_q) * params.heads_ratio;  // of a K/V head
  long long const ctas =
      static_cast<long long>(params.batch) * params.heads_kv * params.num_splits * ((rows + kRows - 1) / kRows);
  if (ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(ctas), Traits::kNThreads, Traits::kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace

bool sm90_decode_covers(const FwdParams& p, int capability) {
  // Two CTAs of 100-104 KB a multiprocessor: sm_90's 227 KB. sm_80 would hold one (and was not
  // measured), sm_86 / sm_89 none (99 KB a block); they keep the tile kernels.
  if (capability < 90) { return false; }
  bool const halves = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  // One K/V sequence an entry, contiguous or paged (pages of a power-of-two size: shifts, not divisions,
  // in the copies of every step); no varlen.
  bool const entry_keys = p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr &&
                          (p.block_table == nullptr || p.page_size_log2 >= 0);
  long long const rows = static_cast<long long>(p.seqlen_q) * p.heads_ratio;
  // A copy pass's rows span less than 4 GB (its stride is a 32-bit register; a step is at most 32 keys,
  // at most 2 bytes an element).
  auto step_in_32_bits = [](long long row_stride) { return row_stride >= 0 && row_stride * 2 * 32 <= UINT32_MAX; };
  // Past one CTA's rows, chunks that each re-read the keys from L2: for a few queries of many grouped heads,
  // where a tile kernel would fill a fraction of each tile's rows and read a K/V head once per query head.
  bool const row_count =
      rows <= kSm90DecodeRows || (rows <= kSm90DecodeMaxRows && p.seqlen_q <= kSm90DecodeChunkedQueries);
  // d = 256: one slab (16 rows: Gemma-2's 2 or 4 rows a K/V head for up to 8 or 4 queries) of a cache in q's
  // dtype (an fp8 cache there runs on a dequantized copy), and only where the tile kernels trail it: a left
  // window bound (1.36x the best tile plan, B 8, 16:8 heads, 8k-32k keys, window 4096 + softcap 50) or more
  // than one query (1.12-1.42x at 4); one query against a whole cache ran at 0.94-0.99x of the best tile plan
  // (H200, scripts/decode_modes_probe.py, bench/NOTES-variants.md) and stays on the tile kernels.
  bool const head_dim_rows =
      p.head_dim <= kSm90DecodeFourWarpHeadDim || (one_slab(p) && !p.kv_fp8 && (p.window_left >= 0 || p.seqlen_q > 1));
  return halves && entry_keys && p.seqlen_q >= 1 && row_count && head_dim_rows &&
         head_dim_listed<CUTLASSFA_SM90_DECODE_HEAD_DIMS>(p.head_dim) && tensorcore_aligned(p) &&
         step_in_32_bits(p.k_row_stride) && step_in_32_bits(p.v_row_stride);
}

KernelTile sm90_decode_tile(const FwdParams& params) {
  // Rows and keys a step do not depend on q's dtype.
  return with_decode_traits<cutlass::half_t, CUTLASSFA_SM90_DECODE_HEAD_DIMS>(params, KernelTile{}, [](auto traits) {
    using Traits = decltype(traits);
    return KernelTile{Traits::kHeadDim, Traits::kRows, Traits::kBlockN};
  });
}

cudaError_t launch_sm90_decode(const FwdParams& params, cudaStream_t stream) {
  int device = 0;
  cudaError_t const err = cudaGetDevice(&device);
  if (err != cudaSuccess) { return err; }
  if (!sm90_decode_covers(params, device_capability(device))) { return cudaErrorNotSupported; }
  if (params.batch == 0 || params.heads_q == 0) { return cudaSuccess; }
  return fp16_switch(params.dtype, [&](auto element) {
    return with_decode_traits<decltype(element), CUTLASSFA_SM90_DECODE_HEAD_DIMS>(
        params, cudaErrorNotSupported,
        [&](auto traits) { return run_decode<decltype(traits)>(params, stream); });
  });
}

}  // namespace cutlassfa
