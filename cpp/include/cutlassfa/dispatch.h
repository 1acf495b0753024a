// The one run-time dispatch from a backend to its kernel family (cpp/src/dispatch.cpp).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/backends.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// Enqueues the backend's kernels on `stream` (on the current device); returns the first CUDA error.
// params.num_splits > 1 on a tensor-core backend: the kernel writes every split into fp32 partials taken
// from the workspace pool, and a combine kernel merges them into o and lse. The split is a schedule of
// the tensor-core kernels only: the CUDA-core backends run the same call in one pass, and the result is
// the same up to rounding either way.
cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream);

// Whether `backend` runs params.num_splits > 1 as a split (the tensor-core families).
bool splits_keys(Backend backend);

// Decode with GQA (one query row, several query heads on each K/V head, no left window bound): the
// tensor-core backends run the heads_ratio query heads that share a K/V head as the rows of one tile
// (FlashAttention-3's PackGQA), so each K/V tile is read once per K/V head, not once per query head.
// With one query the mask does not depend on the row, so the causal / right bound is dropped.
bool packs_gqa(const FwdParams& params);
FwdParams packed_gqa(const FwdParams& params);

// The number of key splits for num_splits=None, from the CTAs of one pass (batch * heads * query tiles
// of 64 rows, after packs_gqa), the key tiles (128 keys each) and the multiprocessors of `device`: 1 when
// the unsplit grid already fills the device, else the fewest splits that give at least 1.5 waves of
// CTAs with a full last wave (or the fullest), each split at least 8 key tiles long.
int choose_num_splits(int device, const FwdParams& params);

// The splits a call runs with: 1 on a backend that does not split keys; else `requested` (the
// num_splits argument; 0: choose_num_splits), at most one split per key tile of 128 and
// kMaxCombinedSplits in all.
int resolve_num_splits(Backend backend, int device, const FwdParams& params, int requested);

// The splits of a plain call (no num_splits argument): a call of at most 64 queries (one query tile, a
// decode step) in fp16 / bf16 splits as num_splits=None would; anything else runs in one pass.
int dense_num_splits(Backend backend, int device, const FwdParams& params);

}  // namespace cutlassfa
