// forward(): one call from Python per attention call for arrays of any supported framework:
// validation, backend choice, output allocation, launch on the framework's stream (or, for host
// arrays, device copies through the workspace pool and a synchronize).
#pragma once

#include <nanobind/nanobind.h>

namespace cutlassfa::bindings {

namespace nb = nanobind;

// q, k, v, out: arrays (out may be None). scale: NaN for 1/sqrt(d). backend: kBackendAuto, kBackendCpu
// or a Backend. alloc: None, or a callable (shape, dtype name, device) -> (result, writable target) for
// frameworks whose arrays cannot be allocated from here (CuPy, JAX). stream: the CUDA stream to launch
// on, or -1 to ask the framework (DLPack exchange API; a per-thread stream otherwise). sync: wait for
// the stream before returning (JAX). Returns (out, lse or None), or None when the resolved backend
// is `cpu` (the caller runs it; the arguments are valid).
nb::object forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale,
                   int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync);

struct VariantArgs;

// forward() with variant arguments (bindings/variant.h): windows, softcap, KV caches (contiguous or paged,
// keys appended first), split keys, and varlen batches (cu_seqlens given: out (total_q, Hq, d), lse
// (Hq, total_q)). Returns None when the resolved backend is `cpu`; raises NotImplementedError for host
// arrays on a GPU backend.
nb::object forward_variant(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale,
                           int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync,
                           const VariantArgs& args);

// The backend `forward` would run for these arguments (validates them the same way).
int select_backend(nb::handle q, nb::handle k, nb::handle v, bool causal, double scale, int backend);

}  // namespace cutlassfa::bindings
