# FindNCCL.cmake — finds nccl.h and libnccl (NCCL_ROOT, $NCCL_HOME or the CUDA toolkit
# first, then the default paths, then python's nvidia-nccl-cu* pip package, which is where
# a machine with PyTorch but no NCCL install has it); sets NCCL_FOUND, NCCL_INCLUDE_DIR,
# NCCL_LIBRARY, NCCL_VERSION and the imported target NCCL::NCCL.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS}/..)
endif()
list(APPEND _nccl_hints /usr/local/cuda)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  # The pip package: site-packages/nvidia/nccl/{include/nccl.h, lib/libnccl.so.2}.
  find_program(NCCL_PYTHON NAMES python3 python)
  mark_as_advanced(NCCL_PYTHON)
  if(NCCL_PYTHON)
    execute_process(COMMAND ${NCCL_PYTHON} -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
                    OUTPUT_VARIABLE _nccl_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET TIMEOUT 30)
  endif()
  if(_nccl_pip)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_pip} PATH_SUFFIXES include NO_DEFAULT_PATH)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_pip} PATH_SUFFIXES lib NO_DEFAULT_PATH)
  endif()
endif()

if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} +([0-9]+)" _m "${_nccl_ver}")
    set(_nccl_${part} ${CMAKE_MATCH_1})
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
