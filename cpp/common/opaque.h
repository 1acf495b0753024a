// Values hidden from the optimizer's algebra, for every kernel family (NVRTC-clean: no includes).
// Mask limits made relative to a thread's first element go through opaque(): otherwise the compiler
// folds the subtraction back into compares of absolute columns with a uniform limit and hoists one
// register per element out of the K/V loop (common/mask.h, simt/flash_simt.cuh).
#pragma once

namespace cutlassfa {

// Returns x unchanged, but hides it from the optimizer's algebra (an empty inline asm).
__forceinline__ __device__ int opaque(int x) {
  asm("" : "+r"(x));
  return x;
}

// Same, and never hoisted or merged with another call (volatile): re-evaluated where it stands.
__forceinline__ __device__ int opaque_volatile(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

}  // namespace cutlassfa
