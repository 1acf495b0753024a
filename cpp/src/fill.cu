// O = 0 and lse = -inf for problems where no row sees a key (Nk = 0) or nothing is computed: a strided
// 4-D fill on the device, so outputs of any layout (out=) are filled in place on the caller's stream.
#include "cutlassfa/fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlassfa {
namespace {

template <typename T>
__global__ void fill_kernel(T* data, Strided4 view, float value) {
  long long const total = view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3];
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long rest = i, offset = 0;
    for (int d = 3; d >= 0; --d) {
      offset += (rest % view.shape[d]) * view.strides[d];
      rest /= view.shape[d];
    }
    data[offset] = static_cast<T>(value);
  }
}

template <typename T>
cudaError_t launch_fill(void* data, const Strided4& view, float value, cudaStream_t stream) {
  long long const total = view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3];
  if (total == 0) return cudaSuccess;
  long long const blocks = (total + 255) / 256;
  fill_kernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(static_cast<T*>(data),
                                                                                              view, value);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fill_device(void* data, DType dtype, const Strided4& view, float value, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32: return launch_fill<float>(data, view, value, stream);
    case DType::kFloat16: return launch_fill<__half>(data, view, value, stream);
    case DType::kBFloat16: return launch_fill<__nv_bfloat16>(data, view, value, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
