#include "cutlassfa/workspace.h"

#include <cstdint>
#include <mutex>
#include <vector>

namespace cutlassfa {
namespace {

std::mutex pools_mutex;
std::vector<cudaMemPool_t> pools;  // index: device; nullptr until first use

cudaError_t pool_for(int device, cudaMemPool_t* pool) {
  std::lock_guard<std::mutex> lock(pools_mutex);
  if (device >= static_cast<int>(pools.size())) pools.resize(device + 1, nullptr);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created = nullptr;
    cudaError_t err = cudaMemPoolCreate(&created, &props);
    if (err != cudaSuccess) return err;
    uint64_t threshold = kRetainBytes;
    err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (err != cudaSuccess) {
      cudaMemPoolDestroy(created);
      return err;
    }
    pools[device] = created;
  }
  *pool = pools[device];
  return cudaSuccess;
}

}  // namespace

cudaError_t workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  cudaMemPool_t pool = nullptr;
  if (err == cudaSuccess) err = pool_for(device, &pool);
  if (err == cudaSuccess) err = cudaMallocFromPoolAsync(ptr, bytes == 0 ? 1 : bytes, pool, stream);
  return err;
}

cudaError_t workspace_free(void* ptr, cudaStream_t stream) {
  return ptr == nullptr ? cudaSuccess : cudaFreeAsync(ptr, stream);
}

cudaError_t workspace_trim() {
  std::lock_guard<std::mutex> lock(pools_mutex);
  for (cudaMemPool_t pool : pools) {
    if (pool == nullptr) continue;
    cudaError_t const err = cudaMemPoolTrimTo(pool, 0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cutlassfa
