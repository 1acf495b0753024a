// The persistent grid's work: about one CTA per SM, each walking (Q tile, head, batch) tiles until none
// is left, so that a CTA loads the next tile's Q and first K/V while its consumers still finish the
// last one (sm90ws/kernel.h).
//
// Order of the tiles: the (batch, head) pairs in sections of `heads_per_section`; within a section the
// Q tiles from the last down (under a causal mask the last has the most keys), the pairs of the section
// innermost. One pair a section is the non-persistent grid's order (common/tile.h): a head's tiles run
// together and re-read its K/V from L2. Wider sections put the heaviest tiles of several heads first
// while their K/V still fit in L2 together.
//
// Who takes which tile: `counter` == nullptr, CTA b takes tiles b, b + grid, b + 2 grid, ... (equal
// tiles: no mask that changes their work); otherwise tiles beyond the first wave go to whichever CTA
// asks first (one atomicAdd on a zeroed counter), the longest first under that order: a causal or
// windowed grid ends evenly.
#pragma once

#include "common/tile.h"
#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

struct TileScheduler {
  int num_tiles;          // num_m_blocks * batch * heads_q
  int num_m_blocks;       // Q tiles of one head
  int heads_per_section;  // (batch, head) pairs of one section, >= 1
  int* counter;           // nullptr: static order; else a zeroed int of this launch

  __forceinline__ __device__ int first() const { return static_cast<int>(blockIdx.x); }

  // The tile after `current` for this CTA; >= num_tiles when there is none. Called by one thread.
  __forceinline__ __device__ int next(int current) const {
    if (counter == nullptr) { return current + static_cast<int>(gridDim.x); }
    return static_cast<int>(gridDim.x) + atomicAdd(counter, 1);
  }

  __forceinline__ __device__ TileCoord tile(FwdParams const& params, int index) const {
    int const section_tiles = num_m_blocks * heads_per_section;
    int const section = index / section_tiles;
    int const in_section = index - section * section_tiles;
    int const pairs_before = section * heads_per_section;
    int const num_pairs = params.batch * params.heads_q;
    int const pairs = min(heads_per_section, num_pairs - pairs_before);  // the last section may be narrower
    int const m_block = num_m_blocks - 1 - in_section / pairs;
    int const pair = pairs_before + in_section % pairs;
    int const head = pair % params.heads_q;
    return {m_block, head, pair / params.heads_q, head / params.heads_ratio, 0};
  }
};

}  // namespace cutlassfa::sm90ws
