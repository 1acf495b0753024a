// forward(): one call from Python per attention call, for arrays of any supported framework and every
// option: validation (bindings/request.h), backend choice, output allocation, launch on the
// framework's stream (or, for host arrays, device copies through the workspace pool and a synchronize).
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "bindings/request.h"

namespace cutlassfa::bindings {

namespace nb = nanobind;

// backend: kBackendAuto, kBackendCpu or a Backend. alloc: None, or a callable (shape, dtype name,
// device) -> (result, writable target) for frameworks whose arrays cannot be allocated from here (CuPy,
// JAX). stream: the CUDA stream to launch on, or -1 to ask the framework (DLPack exchange API; a
// per-thread stream otherwise). sync: wait for the stream before returning (JAX). Returns (out, lse or
// None); varlen calls (cu_seqlens given) return out (total_q, Hq, d) and lse (Hq, total_q). Returns None
// when the resolved backend is `cpu` (the caller runs it; the arguments are valid).
nb::object forward(const Request& request, int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync);

// What forward would launch for the call, launching nothing: {backend, kernel (dispatch.h's kernel_name,
// "fill" when no row sees a key, "cpu"), num_splits, gqa_packed, tile (rows, keys) or None, kernel_head_dim
// (the compiled width) or None, fp8_dequantized, tuned (the measured table chose), tune_class (the
// table's class of the call, cutlassfa/tuning.h, or None)}. capability <= 0: on the arrays' device (host
// arrays: GPU 0); else on a device of that capability and multiprocessor count, present or not.
nb::dict plan(const Request& request, int backend, int capability, int multiprocessors);

// Installs the measured table for devices of (capability, multiprocessors): entries (tune class, kernel
// name, num_splits); an empty list removes it. ValueError naming a malformed entry, nothing installed.
void set_tuning(int capability, int multiprocessors, const std::vector<nb::tuple>& entries);

}  // namespace cutlassfa::bindings
