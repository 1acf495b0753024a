// A strided fill of device memory (cpp/src/fill.cu): outputs of problems no kernel computes.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// A 4-D view: extents and strides in elements (lower ranks pad with extent 1).
struct Strided4 {
  long long shape[4];
  long long strides[4];
};

cudaError_t fill_device(void* data, DType dtype, const Strided4& view, float value, cudaStream_t stream);

}  // namespace cutlassfa
