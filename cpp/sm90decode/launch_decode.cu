// launch_sm80_decode: what the decode kernel (cpp/sm80/decode_kernel.h) covers, and its launch. Its
// few instantiations (fp16 / bf16 x CUTLASSFA_SM80_DECODE_HEAD_DIMS x 16 / 32 rows) compile here,
// in one object.
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

template <int kHeadDim, class Element, int kRows>
cudaError_t run_decode(const FwdParams& params, cudaStream_t stream) {
  using Traits = sm80::DecodeTraits<kHeadDim, Element, kRows>;
  auto kernel = &sm80::decode_kernel<Traits>;
  if constexpr (Traits::kSmemSize > 48 * 1024) {
    cudaError_t const err = opt_in_shared_memory(kernel, Traits::kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  long long const ctas = static_cast<long long>(params.batch) * params.heads_kv * params.num_splits;
  if (ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(ctas), Traits::kNThreads, Traits::kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace

bool sm80_decode_covers(const FwdParams& p) {
  // Two CTAs of 100-104 KB a multiprocessor: sm_90's 227 KB. sm_80 would hold one (and was not
  // measured), sm_86 / sm_89 none (99 KB a block); they keep the tile kernels.
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device_capability(device) < 90) { return false; }
  bool const halves = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  // One K/V sequence an entry, contiguous or paged (pages of a power-of-two size: shifts, not divisions,
  // in the copies of every step); no varlen, no left padding.
  bool const entry_keys = p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.leftpad_k == nullptr &&
                          (p.block_table == nullptr || p.page_size_log2 >= 0);
  long long const rows = static_cast<long long>(p.seqlen_q) * p.heads_ratio;
  // A copy pass's rows span less than 4 GB (its stride is a 32-bit register; a step is at most 32 rows,
  // 2 bytes an element).
  auto step_in_32_bits = [](long long row_stride) { return row_stride >= 0 && row_stride * 2 * 32 <= UINT32_MAX; };
  return halves && entry_keys && p.seqlen_q >= 1 && rows <= kSm80DecodeRows && p.window_left < 0 &&
         p.softcap_pre == 0.f && head_dim_listed<CUTLASSFA_SM80_DECODE_HEAD_DIMS>(p.head_dim) && tensorcore_aligned(p) &&
         step_in_32_bits(p.k_row_stride) && step_in_32_bits(p.v_row_stride);
}

cudaError_t launch_sm80_decode(const FwdParams& params, cudaStream_t stream) {
  if (!sm80_decode_covers(params)) { return cudaErrorNotSupported; }
  if (params.batch == 0 || params.heads_q == 0) { return cudaSuccess; }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    return head_dim_switch<CUTLASSFA_SM80_DECODE_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      constexpr int kHeadDim = decltype(head_dim)::value;
      bool const one_slab = static_cast<long long>(params.seqlen_q) * params.heads_ratio <= 16;
      return one_slab ? run_decode<kHeadDim, Element, 16>(params, stream) : run_decode<kHeadDim, Element, 32>(params, stream);
    });
  });
}

}  // namespace cutlassfa
