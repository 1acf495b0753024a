// Helpers of the SM90 forward kernel (the accumulator views and the warpgroup GEMMs are
// common/wgmma.h's).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common/wgmma.h"

namespace cutlassfa::sm90 {

using namespace cute;

// Make this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the async
// proxy that wgmma reads through; a barrier must still follow before another thread's wgmma.
__forceinline__ __device__ void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace cutlassfa::sm90
