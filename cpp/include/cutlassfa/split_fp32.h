// fp32 inputs for the fp16 wgmma kernels (cpp/sm90, cpp/sm90ws): one pre-pass splits every fp32 value x
// into fp16 hi = fp16(x) and lo = fp16(x - hi) and lays Q and K out as two column halves,
//     Q' = [Qhi | Qlo],  K' = [Khi | Klo],  V' = Vhi,
// from which a kernel's S GEMM forms Qhi Khi^T + Qhi Klo^T + Qlo Khi^T: the split-precision scores of
// the SM80 fp32 path (lo lo^T, ~2^-22 relative, dropped), with no conversion inside the K/V loop. P and
// V are rounded to fp16 once, O accumulates and is written in fp32. |x| <= 1e4 stays far inside fp16's
// range (65504).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// Enqueues the split of params.q / k / v (fp32, any strides, dense (batch, heads, seqlen, d)) into a
// stream-ordered workspace (cutlassfa/workspace.h) and sets `split` to params with q, k, v pointing at
// the fp16 rows: (batch, heads, seqlen) contiguous, 2 d columns for q and k, d for v; o, lse and the rest
// as in params. split_q = false leaves q as it is (fp32, for a kernel that splits Q itself:
// sm90ws/split_q.h). On success *workspace is to be released (workspace_free) on `stream` after the
// kernel that reads it is enqueued. cpp/src/split_fp32.cu.
cudaError_t split_fp32_inputs(const FwdParams& params, FwdParams& split, void** workspace, cudaStream_t stream,
                              bool split_q = true);

}  // namespace cutlassfa
