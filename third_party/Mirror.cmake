# cutlassfa_mirror(SOURCE DESTINATION): copies the tree SOURCE to DESTINATION, touching only files whose
# content changed. pip builds in a fresh temporary environment each time, and the CUTLASS and nanobind
# sources live there: compiling them from a stable copy in the build directory keeps every compile
# command, and so the previous build's objects, valid across `pip install .` runs.
function(cutlassfa_mirror source destination)
  file(GLOB_RECURSE _files RELATIVE "${source}" "${source}/*")
  foreach(_file ${_files})
    if(_file MATCHES "__pycache__|\\.pyc$")
      continue()
    endif()
    get_filename_component(_dir "${destination}/${_file}" DIRECTORY)
    file(MAKE_DIRECTORY "${_dir}")
    file(COPY_FILE "${source}/${_file}" "${destination}/${_file}" ONLY_IF_DIFFERENT)
  endforeach()
endfunction()
