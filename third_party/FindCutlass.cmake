# Finds the CUTLASS/CuTe headers; defines the INTERFACE target cutlass::headers.
# See README.md beside this file for where they come from.

if(NOT CUTLASS_DIR AND DEFINED ENV{CUTLASS_DIR})
  set(CUTLASS_DIR "$ENV{CUTLASS_DIR}")
endif()

if(CUTLASS_DIR)
  set(_cutlass_include "${CUTLASS_DIR}/include")
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _cutlass_include
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _cutlass_status)
  if(NOT _cutlass_status EQUAL 0)
    set(_cutlass_include "")
  endif()
endif()

if(NOT EXISTS "${_cutlass_include}/cute/tensor.hpp")
  message(FATAL_ERROR
    "CUTLASS headers not found (looked in '${_cutlass_include}'). Install the build requirement "
    "nvidia-cutlass==4.2.0.0 or set CUTLASS_DIR to a CUTLASS checkout.")
endif()

# Headers of the build requirement sit in pip's temporary build environment: mirror them to a path that
# stays the same from one build to the next (Mirror.cmake).
if(NOT CUTLASS_DIR)
  include(Mirror)
  cutlassfa_mirror("${_cutlass_include}" "${CMAKE_BINARY_DIR}/_deps/cutlass/include")
  set(_cutlass_include "${CMAKE_BINARY_DIR}/_deps/cutlass/include")
endif()

message(STATUS "CUTLASS headers: ${_cutlass_include}")
add_library(cutlass_headers INTERFACE)
target_include_directories(cutlass_headers SYSTEM INTERFACE "${_cutlass_include}")
add_library(cutlass::headers ALIAS cutlass_headers)
