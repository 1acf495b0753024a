#include "bindings/cuda_errors.h"

#include <nanobind/nanobind.h>

namespace cutlassfa::bindings {

void throw_cuda_error(cudaError_t status, const char* what, size_t bytes) {
  cudaGetLastError();  // reset the last (non-sticky) error so the next call starts clean
  if (status == cudaErrorMemoryAllocation && bytes > 0) {
    PyErr_Format(PyExc_MemoryError, "%s: CUDA out of memory allocating %zu bytes (%s)", what, bytes,
                 cudaGetErrorString(status));
  } else if (status == cudaErrorMemoryAllocation) {
    PyErr_Format(PyExc_MemoryError, "%s: CUDA out of memory for its workspace (%s)", what, cudaGetErrorString(status));
  } else {
    PyErr_Format(PyExc_RuntimeError, "%s: %s (%s)", what, cudaGetErrorString(status), cudaGetErrorName(status));
  }
  throw nanobind::python_error();
}

}  // namespace cutlassfa::bindings
