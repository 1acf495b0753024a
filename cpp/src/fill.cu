// O = 0 and lse = -inf for problems where no row sees a key (Nk = 0) or nothing is computed: a strided
// 4-D fill on the device, so outputs of any layout (out=) are filled in place on the caller's stream.
// Also the conversion of a small fp16 / bf16 device array to float32 (attention sinks).
#include "cutlassfa/fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlassfa {
namespace {

template <typename T>
__global__ void fill_kernel(T* data, Strided4 view, float value, const float* per_head) {
  long long const total = view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3];
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long rest = i, offset = 0, head = 0;
    for (int d = 3; d >= 0; --d) {
      long long const coord = rest % view.shape[d];
      offset += coord * view.strides[d];
      if (d == 1) head = coord;
      rest /= view.shape[d];
    }
    data[offset] = static_cast<T>(per_head != nullptr ? per_head[head] : value);
  }
}

template <typename T>
cudaError_t launch_fill(void* data, const Strided4& view, float value, const float* per_head, cudaStream_t stream) {
  long long const total = view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3];
  if (total == 0) return cudaSuccess;
  long long const blocks = (total + 255) / 256;
  fill_kernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(static_cast<T*>(data),
                                                                                              view, value, per_head);
  return cudaGetLastError();
}

template <typename From>
__global__ void to_float_kernel(const From* from, float* to, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    to[i] = static_cast<float>(from[i]);
  }
}

template <typename From>
cudaError_t launch_to_float(const void* from, float* to, int n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  int const blocks = (n + 255) / 256;
  to_float_kernel<From><<<blocks < 1024 ? blocks : 1024, 256, 0, stream>>>(static_cast<const From*>(from), to, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fill_device(void* data, DType dtype, const Strided4& view, float value, cudaStream_t stream,
                        const float* per_head) {
  switch (dtype) {
    case DType::kFloat32: return launch_fill<float>(data, view, value, per_head, stream);
    case DType::kFloat16: return launch_fill<__half>(data, view, value, per_head, stream);
    case DType::kBFloat16: return launch_fill<__nv_bfloat16>(data, view, value, per_head, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t convert_to_float32(const void* from, DType dtype, float* to, int n, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32: return cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case DType::kFloat16: return launch_to_float<__half>(from, to, n, stream);
    case DType::kBFloat16: return launch_to_float<__nv_bfloat16>(from, to, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
