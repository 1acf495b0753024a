// fp8 P V: the order of the keys along the K index of O += P V, so that P goes from the S accumulator
// into the e4m3 A operand without moving bytes between threads.
//
// A thread's S accumulator (wgmma C layout) holds, per 8-key chunk, keys 2q and 2q + 1 (q = lane % 4) of
// rows g and g + 8 (g = lane / 4). The e4m3 A operand of a k = 32 wgmma wants 4 consecutive k indices
// in each 32-bit register: k = 4q .. 4q + 3 of row g (register 0), of row g + 8 (1), then k + 16 of each
// (2, 3). So a thread packs, per 32-key group and row, keys (2q, 2q + 1, 8 + 2q, 9 + 2q) into register 0
// and (16 + 2q, 17 + 2q, 24 + 2q, 25 + 2q) into register 2: k index k of the group then carries key
// fp8_pv_key(k). The B operand (V^T, keys contiguous) must carry the same key at k: the V^T pre-pass
// (fp8_v_transpose.cu) writes column k of each 32-key group from key fp8_pv_key(k).
// cpp/sm90ws/fp8_layout_check.cu checks the whole composition against CuTe's layouts. Free of CuTe, so that
// the V^T pre-pass compiles without it; the accumulator's view in this order is sm90ws/fp8_p_operand.h.
#pragma once

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

// Keys of one group of the permutation: one k = 32 step of the e4m3 wgmma.
constexpr int kFp8KeyGroup = 32;

// The key (within its group of 32) whose value sits at k index k (0..31) of the P V product: a
// permutation of the index bits, k = (b4 b3 b2 b1 b0) -> key = (b4 b1 b3 b2 b0).
CUTLASSFA_HOST_DEVICE constexpr int fp8_pv_key(int k) {
  return (k & 16) | ((k & 2) << 2) | ((k & 12) >> 1) | (k & 1);
}

// Columns of one (batch, K/V head, dim) row of the V^T workspace: the keys rounded up to whole groups
// (the keys past seqlen_k are zeros there; TMA reads zeros past the row).
CUTLASSFA_HOST_DEVICE constexpr int fp8_vt_keys(int seqlen_k) {
  return (seqlen_k + kFp8KeyGroup - 1) / kFp8KeyGroup * kFp8KeyGroup;
}

namespace detail {
constexpr bool fp8_pv_key_is_permutation() {
  bool seen[kFp8KeyGroup] = {};
  for (int k = 0; k < kFp8KeyGroup; ++k) {
    int const key = fp8_pv_key(k);
    if (key < 0 || key >= kFp8KeyGroup || seen[key]) { return false; }
    seen[key] = true;
  }
  return true;
}
}  // namespace detail
static_assert(detail::fp8_pv_key_is_permutation(), "each k index carries one key of its group");
static_assert(fp8_pv_key(0) == 0 && fp8_pv_key(1) == 1 && fp8_pv_key(2) == 8 && fp8_pv_key(3) == 9 &&
                  fp8_pv_key(4) == 2 && fp8_pv_key(16) == 16 && fp8_pv_key(18) == 24,
              "register 0 of thread q = 0 holds keys 0, 1, 8, 9; register 2 keys 16, 17, 24, 25");

}  // namespace cutlassfa::sm90ws
