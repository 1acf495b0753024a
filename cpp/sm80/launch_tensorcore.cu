// launch_tensorcore and launch_tensorcore_sm80: checks, the choice of the wgmma (sm90) or mma.sync
// (sm80) family, the dtype / head-dim switch onto the kernels instantiated in
// cpp/src/inst/sm{80,90}_hdim<d>.cu, and the fp32 path.
//
// On sm_90 (head dims 64, 128) fp32 inputs go to sm90::launch_fp32, which splits them in a pre-pass
// (cpp/sm90/launch_fp32.cu). On the mma.sync kernel fp32 inputs are read by the kernel itself
// (run_fwd_fp32): it splits q and k into fp16 hi + lo on the way to shared memory and computes
// S = QK^T with three fp16 MMAs (hi hi, hi lo, lo hi), V and P in one fp16 rounding, O in fp32.
// fp16 holds finite values up to 65504, so |x| <= 1e4 never overflows. Rounding q and k once to
// fp16 (the previous pre-pass) gave max abs errors of 6.3e-3 on the HW4 shapes, over the 5e-3 rule.
// TF32 atoms keep the same 10 mantissa bits at half the rate. The kernel's 16-byte fp32 loads need
// aligned q, k, v; other layouts are first copied to contiguous fp32 by a small pre-pass into a
// stream-ordered workspace.
#include <algorithm>

#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "sm80/launch_fwd.h"
#include "sm80/static_switch.h"
#if CUTLASSFA_HAS_SM90
#include "sm90/launch_fwd.h"
#endif

namespace cutlassfa {
namespace sm80 {
namespace {

bool multiple_of(long long stride, long long extent, long long elems) { return extent <= 1 || stride % elems == 0; }

bool aligned16(const void* ptr) { return reinterpret_cast<unsigned long long>(ptr) % 16 == 0; }

// Every tile row the kernel moves is one 16-byte vector per thread (cp.async for q, k, v, st.global
// for o), so each row start must be 16-byte aligned: the base pointer, and the batch, head and row
// strides in multiples of 16 bytes (a stride over an extent of 1 is never applied and not checked).
bool tensor_aligned(const void* ptr, long long batch_stride, long long head_stride, long long row_stride,
                    int batch, int heads, int seqlen, int elem_bytes) {
  long long const elems = 16 / elem_bytes;
  return aligned16(ptr) && multiple_of(batch_stride, batch, elems) && multiple_of(head_stride, heads, elems) &&
         multiple_of(row_stride, seqlen, elems);
}

// One row of head_dim values per (blockDim.x = head_dim / 4) threads, 4 values per thread: fp32 in
// with any alignment and strides, fp32 out contiguous (batch, heads, seqlen, head_dim).
struct ConvertTensor {
  const float* src;
  float* dst;
  long long batch_stride, head_stride, row_stride;
  int heads, seqlen;
  long long rows;  // batch * heads * seqlen
};

__global__ void copy_fp32_contiguous_kernel(ConvertTensor q, ConvertTensor k, ConvertTensor v, int head_dim) {
  ConvertTensor const t = blockIdx.y == 0 ? q : (blockIdx.y == 1 ? k : v);
  int const col = threadIdx.x * 4;
  for (long long row = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y; row < t.rows;
       row += static_cast<long long>(gridDim.x) * blockDim.y) {
    long long const n = row % t.seqlen;
    long long const bh = row / t.seqlen;
    long long const h = bh % t.heads;
    long long const b = bh / t.heads;
    const float* src = t.src + b * t.batch_stride + h * t.head_stride + n * t.row_stride + col;
    *reinterpret_cast<float4*>(t.dst + row * head_dim + col) = make_float4(src[0], src[1], src[2], src[3]);
  }
}

template <class Element, class ElementOut>
cudaError_t run_fwd_head_dim(const FwdParams& params, cudaStream_t stream) {
  return CUTLASSFA_HEADDIM_SWITCH(params.head_dim, kHeadDim,
                                  [&] { return run_fwd<kHeadDim, Element, ElementOut>(params, stream); });
}

cudaError_t run_fwd_fp32_head_dim(const FwdParams& params, cudaStream_t stream) {
  return CUTLASSFA_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] { return run_fwd_fp32<kHeadDim>(params, stream); });
}

cudaError_t launch_fp32(const FwdParams& params, cudaStream_t stream) {
  if (tensor_aligned(params.q, params.q_batch_stride, params.q_head_stride, params.q_row_stride, params.batch,
                     params.heads_q, params.seqlen_q, 4) &&
      tensor_aligned(params.k, params.k_batch_stride, params.k_head_stride, params.k_row_stride, params.batch,
                     params.heads_kv, params.seqlen_k, 4) &&
      tensor_aligned(params.v, params.v_batch_stride, params.v_head_stride, params.v_row_stride, params.batch,
                     params.heads_kv, params.seqlen_k, 4)) {
    return run_fwd_fp32_head_dim(params, stream);
  }
  int const d = params.head_dim;
  long long const rows_q = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  long long const rows_k = static_cast<long long>(params.batch) * params.heads_kv * params.seqlen_k;
  float* workspace = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&workspace),
                                    static_cast<size_t>(rows_q + 2 * rows_k) * d * sizeof(float), stream);
  if (err != cudaSuccess) { return err; }

  ConvertTensor const q{static_cast<const float*>(params.q), workspace, params.q_batch_stride, params.q_head_stride,
                        params.q_row_stride, params.heads_q, params.seqlen_q, rows_q};
  ConvertTensor const k{static_cast<const float*>(params.k), workspace + rows_q * d, params.k_batch_stride,
                        params.k_head_stride, params.k_row_stride, params.heads_kv, params.seqlen_k, rows_k};
  ConvertTensor const v{static_cast<const float*>(params.v), workspace + (rows_q + rows_k) * d,
                        params.v_batch_stride, params.v_head_stride, params.v_row_stride, params.heads_kv,
                        params.seqlen_k, rows_k};
  dim3 const block(d / 4, 256 / (d / 4));
  long long const blocks = (std::max(rows_q, rows_k) + block.y - 1) / block.y;
  dim3 const grid(static_cast<unsigned>(std::min(blocks, 1LL << 20)), 3);
  copy_fp32_contiguous_kernel<<<grid, block, 0, stream>>>(q, k, v, d);
  err = cudaGetLastError();

  if (err == cudaSuccess) {
    FwdParams p = params;  // same o (fp32, caller's strides); q, k, v now contiguous fp32
    p.q = q.dst;
    p.k = k.dst;
    p.v = v.dst;
    p.q_row_stride = d;
    p.q_head_stride = static_cast<long long>(params.seqlen_q) * d;
    p.q_batch_stride = p.q_head_stride * params.heads_q;
    p.k_row_stride = p.v_row_stride = d;
    p.k_head_stride = p.v_head_stride = static_cast<long long>(params.seqlen_k) * d;
    p.k_batch_stride = p.v_batch_stride = p.k_head_stride * params.heads_kv;
    err = run_fwd_fp32_head_dim(p, stream);
  }
  // Stream-ordered: the memory is released once the kernel that reads it has finished.
  cudaError_t const free_err = cudaFreeAsync(workspace, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

bool tensorcore_supports(const FwdParams& params) {
  if (params.head_dim != 32 && params.head_dim != 64 && params.head_dim != 128) { return false; }
  if (params.heads_kv < 1 || params.heads_ratio < 1 || params.heads_q != params.heads_kv * params.heads_ratio) {
    return false;
  }
  // fp32 inputs of any alignment are accepted: misaligned ones are copied to contiguous fp32 by
  // launch_fp32's pre-pass first. Only O, written by the kernel in fp32, needs the alignment.
  bool const fp32 = params.dtype == DType::kFloat32;
  int const in_bytes = 2;
  int const out_bytes = fp32 ? 4 : 2;
  if (!fp32) {
    if (!tensor_aligned(params.q, params.q_batch_stride, params.q_head_stride, params.q_row_stride, params.batch,
                        params.heads_q, params.seqlen_q, in_bytes) ||
        !tensor_aligned(params.k, params.k_batch_stride, params.k_head_stride, params.k_row_stride, params.batch,
                        params.heads_kv, params.seqlen_k, in_bytes) ||
        !tensor_aligned(params.v, params.v_batch_stride, params.v_head_stride, params.v_row_stride, params.batch,
                        params.heads_kv, params.seqlen_k, in_bytes)) {
      return false;
    }
  }
  return tensor_aligned(params.o, params.o_batch_stride, params.o_head_stride, params.o_row_stride, params.batch,
                        params.heads_q, params.seqlen_q, out_bytes);
}

}  // namespace sm80

cudaError_t launch_tensorcore_sm80(const FwdParams& params, cudaStream_t stream) {
  if (!sm80::tensorcore_supports(params)) { return cudaErrorInvalidValue; }
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (params.dtype == DType::kFloat32) { return sm80::launch_fp32(params, stream); }
  return CUTLASSFA_FP16_SWITCH(params.dtype, Element, [&] {
    return sm80::run_fwd_head_dim<Element, Element>(params, stream);
  });
}

cudaError_t launch_tensorcore(const FwdParams& params, cudaStream_t stream) {
#if CUTLASSFA_HAS_SM90
  // Empty problems and rejected layouts take the SM80 path, which answers them without a launch.
  bool const empty = params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0;
  if (!empty && (params.head_dim == 64 || params.head_dim == 128) && sm80::tensorcore_supports(params)) {
    int device = 0;
    int major = 0;
    int minor = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) { err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); }
    if (err == cudaSuccess) { err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device); }
    if (err != cudaSuccess) { return err; }
    // sm_90a code runs on compute capability 9.0 only.
    if (major == 9 && minor == 0) {
      if (params.dtype == DType::kFloat32) { return sm90::launch_fp32(params, stream); }
      return CUTLASSFA_FP16_SWITCH(params.dtype, Element, [&] {
        return params.head_dim == 64 ? sm90::run_fwd<64, Element>(params, stream)
                                     : sm90::run_fwd<128, Element>(params, stream);
      });
    }
  }
#endif
  return launch_tensorcore_sm80(params, stream);
}

}  // namespace cutlassfa
