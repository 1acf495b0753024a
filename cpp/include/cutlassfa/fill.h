// A strided fill of device memory (cpp/src/fill.cu): outputs of problems no kernel computes; and a
// small array converted to float32 on the device.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// A 4-D view: extents and strides in elements (lower ranks pad with extent 1).
struct Strided4 {
  long long shape[4];
  long long strides[4];
};

// Every element = value, or per_head[h] at head h (the view's axis 1) when per_head is given (device).
cudaError_t fill_device(void* data, DType dtype, const Strided4& view, float value, cudaStream_t stream,
                        const float* per_head = nullptr);

// to[i] = float(from[i]), i < n, both on the device.
cudaError_t convert_to_float32(const void* from, DType dtype, float* to, int n, cudaStream_t stream);

}  // namespace cutlassfa
