// Run-time -> compile-time switches of the tensor-core backend, in one place. Each macro turns a
// value into a constexpr NAME visible to the lambda body, as FlashAttention-2's static_switch.h;
// the set of cases here is the set of kernels that get instantiated (cpp/src/inst/sm80_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "cutlassfa/params.h"

#define CUTLASSFA_BOOL_SWITCH(COND, NAME, ...) \
  [&] {                                         \
    if (COND) {                                 \
      constexpr static bool NAME = true;        \
      return __VA_ARGS__();                     \
    } else {                                    \
      constexpr static bool NAME = false;       \
      return __VA_ARGS__();                     \
    }                                           \
  }()

// head_dim -> kHeadDim; unsupported values were rejected by the launcher's checks.
#define CUTLASSFA_HEADDIM_SWITCH(HEADDIM, NAME, ...) \
  [&] {                                              \
    if (HEADDIM == 32) {                             \
      constexpr static int NAME = 32;                \
      return __VA_ARGS__();                          \
    } else if (HEADDIM == 64) {                      \
      constexpr static int NAME = 64;                \
      return __VA_ARGS__();                          \
    } else {                                         \
      constexpr static int NAME = 128;               \
      return __VA_ARGS__();                          \
    }                                                \
  }()

// fp16 / bf16 -> the MMA element type. fp32 never reaches this switch: it runs as fp16 inputs with
// fp32 output (see launch_tensorcore.cu).
#define CUTLASSFA_FP16_SWITCH(DTYPE, NAME, ...)            \
  [&] {                                                     \
    if (DTYPE == ::cutlassfa::DType::kBFloat16) {           \
      using NAME = cutlass::bfloat16_t;                     \
      return __VA_ARGS__();                                 \
    } else {                                                \
      using NAME = cutlass::half_t;                         \
      return __VA_ARGS__();                                 \
    }                                                       \
  }()
