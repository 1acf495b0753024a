// fp32 inputs on the wgmma kernel: one pre-pass splits every fp32 value x into fp16 hi = fp16(x) and
// lo = fp16(x - hi) and lays Q and K out as two column halves,
//     Q' = [Qhi | Qlo],  K' = [Khi | Klo],  V' = Vhi,
// from which the kernel's S GEMM (sm90::gemm_split) forms Qhi Khi^T + Qhi Klo^T + Qlo Khi^T: the
// split-precision scores of the SM80 fp32 path (lo lo^T, ~2^-22 relative, dropped), with no
// conversion inside the K/V loop. P and V are rounded to fp16 once, O accumulates and is written
// in fp32. |x| <= 1e4 stays far inside fp16's range (65504).
#include <algorithm>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "cutlassfa/workspace.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa::sm90 {
namespace {

// One fp32 tensor (batch, heads, seqlen, d) with any strides, and where its split rows go.
struct SplitTensor {
  const float* src;
  __half* dst;  // rows of blocks * d halves, contiguous (batch, heads, seqlen)
  long long batch_stride, head_stride, row_stride;
  int heads, seqlen;
  long long rows;  // batch * heads * seqlen
  int blocks;      // column blocks per output row: 2 for Q and K (hi, lo), 1 for V (hi)
};

// Each thread converts 4 consecutive values of one row (blockIdx.y picks q, k or v).
__global__ void split_fp32_kernel(SplitTensor q, SplitTensor k, SplitTensor v, int head_dim) {
  SplitTensor const t = blockIdx.y == 0 ? q : (blockIdx.y == 1 ? k : v);
  int const groups_per_row = head_dim / 4;
  long long const groups = t.rows * groups_per_row;
  for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long const row = g / groups_per_row;
    int const col = static_cast<int>(g % groups_per_row) * 4;
    long long const n = row % t.seqlen;
    long long const bh = row / t.seqlen;
    const float* src = t.src + (bh / t.heads) * t.batch_stride + (bh % t.heads) * t.head_stride + n * t.row_stride + col;
    float const x[4] = {src[0], src[1], src[2], src[3]};
    __half2 hi[2];
    __half2 lo[2];
    for (int i = 0; i < 2; ++i) {
      hi[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
      float2 const hf = __half22float2(hi[i]);
      lo[i] = __floats2half2_rn(x[2 * i] - hf.x, x[2 * i + 1] - hf.y);  // exact differences in fp32
    }
    __half* dst = t.dst + row * t.blocks * head_dim + col;
    for (int b = 0; b < t.blocks; ++b) {
      __half2 const* part = b == 1 ? lo : hi;
      *reinterpret_cast<uint2*>(dst + b * head_dim) =
          make_uint2(*reinterpret_cast<unsigned const*>(&part[0]), *reinterpret_cast<unsigned const*>(&part[1]));
    }
  }
}

}  // namespace

cudaError_t launch_fp32(const FwdParams& params, cudaStream_t stream) {
  int const d = params.head_dim;
  long long const rows_q = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  long long const rows_k = static_cast<long long>(params.batch) * params.heads_kv * params.seqlen_k;
  long long const halves_q = rows_q * 2 * d;
  long long const halves_k = rows_k * 2 * d;
  long long const halves_v = rows_k * d;
  __half* workspace = nullptr;
  cudaError_t err = workspace_alloc(reinterpret_cast<void**>(&workspace),
                                    static_cast<size_t>(halves_q + halves_k + halves_v) * sizeof(__half), stream);
  if (err != cudaSuccess) { return err; }

  SplitTensor const q{static_cast<const float*>(params.q), workspace, params.q_batch_stride, params.q_head_stride,
                      params.q_row_stride, params.heads_q, params.seqlen_q, rows_q, /*blocks=*/2};
  SplitTensor const k{static_cast<const float*>(params.k), workspace + halves_q, params.k_batch_stride,
                      params.k_head_stride, params.k_row_stride, params.heads_kv, params.seqlen_k, rows_k,
                      /*blocks=*/2};
  SplitTensor const v{static_cast<const float*>(params.v), workspace + halves_q + halves_k, params.v_batch_stride,
                      params.v_head_stride, params.v_row_stride, params.heads_kv, params.seqlen_k, rows_k,
                      /*blocks=*/1};
  int const threads = 256;
  long long const groups = std::max(rows_q, rows_k) * (d / 4);
  dim3 const grid(static_cast<unsigned>(std::min((groups + threads - 1) / threads, 1LL << 20)), 3);
  split_fp32_kernel<<<grid, threads, 0, stream>>>(q, k, v, d);
  err = cudaGetLastError();

  if (err == cudaSuccess) {
    FwdParams p = params;  // same o (fp32, caller's strides) and lse
    p.q = q.dst;
    p.k = k.dst;
    p.v = v.dst;
    p.q_row_stride = 2LL * d;
    p.q_head_stride = p.q_row_stride * params.seqlen_q;
    p.q_batch_stride = p.q_head_stride * params.heads_q;
    p.k_row_stride = 2LL * d;
    p.k_head_stride = p.k_row_stride * params.seqlen_k;
    p.k_batch_stride = p.k_head_stride * params.heads_kv;
    p.v_row_stride = d;
    p.v_head_stride = static_cast<long long>(d) * params.seqlen_k;
    p.v_batch_stride = p.v_head_stride * params.heads_kv;
    err = head_dim_switch<CUTLASSFA_SM90_HEAD_DIMS>(
        d, [&](auto head_dim) {
          constexpr int kHeadDim = decltype(head_dim)::value;
          if constexpr (kHeadDim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) {
            return run_fwd_split<kHeadDim>(p, stream);
          } else {
            return cudaErrorInvalidValue;
          }
        });
  }
  // Stream-ordered: released once the kernel that reads it has finished.
  cudaError_t const free_err = workspace_free(workspace, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace cutlassfa::sm90
