# The XLA FFI handler for jax.jit on CUDA (cpp/jax/ffi.cpp), compiled into _C when jaxlib's FFI headers
# are found: at CUTLASSFA_JAX_FFI_INCLUDE when given, else from the jax importable by the build's
# Python. pip builds in an isolated environment without jax, so there pass the directory:
#   pip install . -C cmake.define.CUTLASSFA_JAX_FFI_INCLUDE=$(python -c "import jax.ffi; print(jax.ffi.include_dir())")
# Without the headers the package builds as before and jax.jit on CUDA runs a host callback instead.
set(CUTLASSFA_JAX_FFI_INCLUDE "" CACHE PATH "jaxlib's FFI include directory (jax.ffi.include_dir())")
if(NOT CUTLASSFA_JAX_FFI_INCLUDE)
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
                  OUTPUT_VARIABLE _jax_ffi_include OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _jax_ffi_status ERROR_QUIET)
  if(_jax_ffi_status EQUAL 0)
    set(CUTLASSFA_JAX_FFI_INCLUDE "${_jax_ffi_include}")
  endif()
endif()

if(CUTLASSFA_JAX_FFI_INCLUDE AND EXISTS "${CUTLASSFA_JAX_FFI_INCLUDE}/xla/ffi/api/ffi.h")
  message(STATUS "cutlassfa: JAX FFI handler built (headers in ${CUTLASSFA_JAX_FFI_INCLUDE})")
  target_sources(_C PRIVATE "${CMAKE_CURRENT_LIST_DIR}/ffi.cpp")
  target_include_directories(_C SYSTEM PRIVATE "${CUTLASSFA_JAX_FFI_INCLUDE}")
  target_compile_definitions(_C PRIVATE CUTLASSFA_HAS_JAX_FFI=1)
else()
  message(STATUS "cutlassfa: no JAX FFI headers (jax not importable at build time and "
                 "CUTLASSFA_JAX_FFI_INCLUDE not set): jax.jit on CUDA will use a host callback")
endif()
