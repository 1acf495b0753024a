// XLA FFI handler of cutlassfa's forward, for jax.jit on CUDA (python/cutlassfa/integrations/jax.py).
// Compiled into _C only when jaxlib's FFI headers are found at build time (cpp/jax/jax.cmake), which
// defines CUTLASSFA_HAS_JAX_FFI=1.
#pragma once

#include <nanobind/nanobind.h>

namespace cutlassfa {

// Adds `jax_ffi_forward()` to the module: a capsule holding the handler, for
// jax.ffi.register_ffi_target("cutlassfa_forward", capsule, platform="CUDA").
void register_jax_ffi(nanobind::module_& m);

}  // namespace cutlassfa
