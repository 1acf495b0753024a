// The extents the sm90ws TMA descriptors are built over (host: sm90ws/launch_template.h, sm90ws/launch.cu;
// device: sm90ws/producer.h), from the problem alone so that both sides agree.
#pragma once

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

// What the TMA descriptors of q / o and k / v span, as (rows, d, heads, batch): the (batch, heads, seqlen,
// d) tensors of a dense call, or the packed (total, heads, d) arrays of a varlen one as a batch of one,
// each entry's tiles then offset by its first row (cu_seqlens). A tile that runs past its entry's end
// reads the next entry's rows (masked as keys, never stored as queries) or, past the array, zeros.
struct TmaExtents {
  int rows_q, rows_k, batch;
};
// packed: a varlen call (Traits::kVarlen on the device, both cu_seqlens given on the host).
CUTLASSFA_HOST_DEVICE inline TmaExtents tma_extents(FwdParams const& p, bool packed) {
  return {packed ? p.total_q : p.seqlen_q, packed ? p.total_k : p.seqlen_k, packed ? 1 : p.batch};
}

}  // namespace cutlassfa::sm90ws
