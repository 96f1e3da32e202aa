# FindNCCL.cmake — finds nccl.h and libnccl (NCCL_ROOT, $NCCL_HOME or the CUDA toolkit
# first, then the default paths); sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY,
# NCCL_VERSION and the imported target NCCL::NCCL.
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
