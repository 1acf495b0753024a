# Kernels compiled once, linked into extensions for several Pythons (the kernel objects depend on no
# Python): `cmake --build <build> --target cutlassfa_kernels_export` copies a build's kernel objects, one
# folder per family, with a STAMP, into CUTLASSFA_KERNELS_EXPORT_DIR; a build configured with
# -DCUTLASSFA_KERNELS_FROM=<that folder> links those objects instead of compiling the families. The STAMP
# is a hash of every kernel source (cpp/ but the bindings), of the generated headers and instantiation files
# (not of their grouping into objects), and of the compiler release, flags, architectures and CUTLASS
# release: a folder made from anything else is refused at configure time, never linked. The export computes
# it when it copies the objects (this file run as a script), so that it describes the sources they were just
# built from.
# Included by the top-level CMakeLists.txt after the generated headers are written.

function(cutlassfa_kernels_stamp out source_dir generated compiler flags architectures cutlass_include)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" release "${compiler}")
  file(SHA256 "${cutlass_include}/cutlass/version.h" cutlass)
  set(text "${release}|${architectures}|${flags}|${cutlass}|")
  foreach(root "${source_dir}" "${generated}")
    file(GLOB_RECURSE files RELATIVE "${root}" "${root}/*")
    if(root STREQUAL source_dir)
      list(FILTER files INCLUDE REGEX "^cpp/")
      list(FILTER files EXCLUDE REGEX "^cpp/(bindings|jax)/")
    else()
      list(FILTER files EXCLUDE REGEX "_build_config\\.py$")  # the Python side's description of the build
      # How the instantiation files are grouped into objects (a machine's core count) changes no kernel: objects
      # exported on a many-core machine link into a build on a 2-core one.
      list(FILTER files EXCLUDE REGEX "^objects/")
    endif()
    list(SORT files)
    foreach(file IN LISTS files)
      file(SHA256 "${root}/${file}" hash)
      string(APPEND text "${file}=${hash}|")
    endforeach()
  endforeach()
  string(SHA256 stamp "${text}")
  set(${out} ${stamp} PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)  # the export: cmake -DSOURCE_DIR=... (as below) -DSTAMP_FILE=<file> -P this file
  cutlassfa_kernels_stamp(stamp "${SOURCE_DIR}" "${GENERATED}" "${COMPILER}" "${FLAGS}" "${ARCHITECTURES}"
                          "${CUTLASS_INCLUDE}")
  file(WRITE "${STAMP_FILE}" "${stamp}\n")
  # Beside it, how the instantiation files were grouped into objects: a build that links them groups its
  # sources the same way (cpp/CMakeLists.txt), whatever its own core count.
  if(DEFINED INSTANCES_PER_OBJECT)
    get_filename_component(folder "${STAMP_FILE}" DIRECTORY)
    file(WRITE "${folder}/INSTANCES_PER_OBJECT" "${INSTANCES_PER_OBJECT}\n")
  endif()
  return()
endif()

# Lists joined with ',' (a ';' would split the script's -D arguments).
string(REPLACE ";" "," _stamp_flags "${CUTLASSFA_CUDA_FLAGS}")
string(REPLACE ";" "," _stamp_architectures "${CMAKE_CUDA_ARCHITECTURES}")
if(CUTLASSFA_KERNELS_FROM)
  cutlassfa_kernels_stamp(stamp "${PROJECT_SOURCE_DIR}" "${GENERATED}" "${CMAKE_CUDA_COMPILER_VERSION}"
                          "${_stamp_flags}" "${_stamp_architectures}" "${_cutlass_include}")
  file(READ "${CUTLASSFA_KERNELS_FROM}/STAMP" prebuilt_stamp)
  string(STRIP "${prebuilt_stamp}" prebuilt_stamp)
  if(NOT prebuilt_stamp STREQUAL stamp)
    message(FATAL_ERROR "CUTLASSFA_KERNELS_FROM=${CUTLASSFA_KERNELS_FROM}: its kernels were built from other "
                        "sources or another configuration (STAMP ${prebuilt_stamp}, this build's ${stamp}); "
                        "build them again, or leave the option empty")
  endif()
  message(STATUS "cutlassfa kernels: linked from ${CUTLASSFA_KERNELS_FROM}")
else()
  set(CUTLASSFA_KERNELS_EXPORT_DIR "${CMAKE_BINARY_DIR}/kernels" CACHE PATH "where cutlassfa_kernels_export writes")
  set(export_commands COMMAND "${CMAKE_COMMAND}" -E rm -rf "${CUTLASSFA_KERNELS_EXPORT_DIR}")
  foreach(family IN LISTS CUTLASSFA_KERNEL_FAMILIES)
    list(APPEND export_commands
         COMMAND "${CMAKE_COMMAND}" -E make_directory "${CUTLASSFA_KERNELS_EXPORT_DIR}/${family}"
         COMMAND "${CMAKE_COMMAND}" -E copy "$<TARGET_OBJECTS:${family}>" "${CUTLASSFA_KERNELS_EXPORT_DIR}/${family}/")
  endforeach()
  add_custom_target(cutlassfa_kernels_export ${export_commands}
                    COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DGENERATED=${GENERATED}"
                            "-DCOMPILER=${CMAKE_CUDA_COMPILER_VERSION}" "-DFLAGS=${_stamp_flags}"
                            "-DARCHITECTURES=${_stamp_architectures}" "-DCUTLASS_INCLUDE=${_cutlass_include}"
                            "-DSTAMP_FILE=${CUTLASSFA_KERNELS_EXPORT_DIR}/STAMP"
                            "-DINSTANCES_PER_OBJECT=${CUTLASSFA_INSTANCES_PER_OBJECT}" -P "${CMAKE_CURRENT_LIST_FILE}"
                    DEPENDS ${CUTLASSFA_KERNEL_FAMILIES} COMMAND_EXPAND_LISTS VERBATIM)
endif()
