# cmake/cuda.cmake — the CUDA backend's build: ATTN_CUDA=AUTO|ON|OFF, the kernel library
# attnrun_cuda_kernels (one instance .cu per head dims x dtype x causal x direction), the
# ptxas spill check, the GPU tests (exit 77 without a GPU) and the GPU benchmark; and,
# whenever tests are built on x86-64, the same kernel source on the CPU emulator
# (test_cuda_emu), which needs no nvcc.
#
# include(cmake/cuda.cmake) from the top level after the attnrun target exists (it links
# the kernels into attnrun and defines ATTN_HAVE_CUDA=1 there), or from a project of its
# own (tests/gpu/standalone). Reads ATTN_CUDA, ATTN_CUDA_HEAD_DIMS, ATTN_WERROR,
# ATTN_BUILD_TESTS, ATTN_BUILD_BENCH, ATTN_SANITIZE; sets ATTN_CUDA_ENABLED.
include_guard(GLOBAL)
get_filename_component(ATTN_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

set(ATTN_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO|ON|OFF")
set_property(CACHE ATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(ATTN_CUDA_HEAD_DIMS "64;128;256;192x128" CACHE STRING
    "Head dims the CUDA bf16/f16 kernels are instantiated for: D (Dqk == Dv) or DqkxDv")
if(NOT DEFINED ATTN_BUILD_TESTS)
  set(ATTN_BUILD_TESTS ON)
endif()
if(NOT DEFINED ATTN_BUILD_BENCH)
  set(ATTN_BUILD_BENCH ON)
endif()

# Instance sources for the requested head dims (hd<D> or hd<Dqk>x<Dv>); one without files
# is an error. The float32 kernels read the head dims at run time: always built.
set(ATTN_CUDA_DIR ${ATTN_ROOT}/kernels/cuda)
set(ATTN_CUDA_INSTANCES ${ATTN_CUDA_DIR}/fwd_f32.cu ${ATTN_CUDA_DIR}/bwd_f32.cu)
set(ATTN_CUDA_DIM_DEFS "")
set(ATTN_CUDA_DIMS_STR "")
file(GLOB attn_known RELATIVE ${ATTN_CUDA_DIR} ${ATTN_CUDA_DIR}/fwd_hd*_bf16.cu)
string(REGEX REPLACE "fwd_hd([0-9x]+)_bf16.cu" "\\1" attn_known "${attn_known}")
foreach(hd IN LISTS ATTN_CUDA_HEAD_DIMS)
  foreach(pass fwd bwd)
    foreach(dt bf16 f16)
      foreach(causal "" "_causal")
        set(f ${ATTN_CUDA_DIR}/${pass}_hd${hd}_${dt}${causal}.cu)
        if(NOT EXISTS ${f})
          message(FATAL_ERROR "ATTN_CUDA_HEAD_DIMS=${ATTN_CUDA_HEAD_DIMS}: head dim ${hd} has "
                              "no instance ${f}; the kernels exist for ${attn_known}")
        endif()
        list(APPEND ATTN_CUDA_INSTANCES ${f})
      endforeach()
    endforeach()
  endforeach()
  list(APPEND ATTN_CUDA_DIM_DEFS ATTN_CUDA_HD_${hd})
  if(ATTN_CUDA_DIMS_STR)
    string(APPEND ATTN_CUDA_DIMS_STR ", ")
  endif()
  string(APPEND ATTN_CUDA_DIMS_STR "${hd}")
endforeach()

# The Hopper forward and backward: their own instances, built for sm_90a alone, at the head
# dims each direction has (ATTN_CUDA_SM90_FWD_DIMS / _BWD_DIMS, within ATTN_CUDA_HEAD_DIMS);
# ATTN_CUDA_SM90_DEFS tells dispatch.c which (ATTN_CUDA_SM90_FWD_HD<d>, _BWD_HD<d>).
set(ATTN_CUDA_SM90_FWD_DIMS 64 128 192x128 256)
set(ATTN_CUDA_SM90_BWD_DIMS 64 128 192x128 256)
set(ATTN_CUDA_SM90_INSTANCES "")
set(ATTN_CUDA_SM90_DEFS "")
foreach(dir fwd bwd)
  string(TOUPPER ${dir} DIR)
  foreach(hd IN LISTS ATTN_CUDA_SM90_${DIR}_DIMS)
    if(hd IN_LIST ATTN_CUDA_HEAD_DIMS)
      foreach(dt bf16 f16)
        foreach(causal "" "_causal")
          list(APPEND ATTN_CUDA_SM90_INSTANCES ${ATTN_CUDA_DIR}/${dir}_hd${hd}_${dt}${causal}_sm90.cu)
        endforeach()
      endforeach()
      list(APPEND ATTN_CUDA_SM90_DEFS ATTN_CUDA_SM90_${DIR}_HD${hd})
    endif()
  endforeach()
endforeach()
if(ATTN_CUDA_SM90_INSTANCES)
  list(APPEND ATTN_CUDA_SM90_DEFS ATTN_CUDA_SM90=1)
endif()

# ---- the real CUDA build -----------------------------------------------------------------
set(ATTN_CUDA_ENABLED OFF)
if(NOT ATTN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ATTN_CUDA_ENABLED ON)
  elseif(ATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ATTN_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER "
                        "or put nvcc on PATH; ATTN_CUDA=AUTO builds without the backend)")
  else()
    message(STATUS "attnrun: no CUDA compiler found, the CUDA backend is not built")
  endif()
endif()

if(ATTN_CUDA_ENABLED)
  # Explicit architectures; nothing asks the hardware. sm_80 and sm_90a machine code (the
  # mma.sync kernels need sm_80+; 90a keeps the door open for wgmma), plus compute_80 PTX.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "80;90a" CACHE STRING "CUDA architectures" FORCE)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  list(APPEND CMAKE_MODULE_PATH ${ATTN_ROOT}/cmake)
  find_package(NCCL)
  message(STATUS "attnrun: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}, head dims ${ATTN_CUDA_DIMS_STR})")

  add_library(attnrun_cuda_kernels STATIC
    ${ATTN_CUDA_INSTANCES} ${ATTN_CUDA_DIR}/state.cu ${ATTN_CUDA_DIR}/ops.cu
    ${ATTN_CUDA_DIR}/dispatch.c ${ATTN_CUDA_DIR}/tiles.c)
  # Directory-wide flags meant for the C compiler (-Wall, -Werror, -fsanitize=...) reach
  # this target too, and nvcc rejects them: keep them to its C sources.
  get_target_property(attn_inherited attnrun_cuda_kernels COMPILE_OPTIONS)
  if(attn_inherited)
    set(attn_wrapped "")
    foreach(opt IN LISTS attn_inherited)
      list(APPEND attn_wrapped "$<$<NOT:$<COMPILE_LANGUAGE:CUDA>>:${opt}>")
    endforeach()
    set_property(TARGET attnrun_cuda_kernels PROPERTY COMPILE_OPTIONS "${attn_wrapped}")
  endif()
  target_include_directories(attnrun_cuda_kernels
    PUBLIC ${ATTN_CUDA_DIR} ${ATTN_ROOT}/include PRIVATE ${ATTN_ROOT}/runtime)
  target_compile_definitions(attnrun_cuda_kernels PRIVATE ${ATTN_CUDA_DIM_DEFS}
    "ATTN_CUDA_HEAD_DIMS_STR=\"${ATTN_CUDA_DIMS_STR}\"")
  set_target_properties(attnrun_cuda_kernels PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    C_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
  # -Xptxas=-v: registers, stack and spills per kernel; the launcher below keeps each
  # object's report in ptxas/ for the spill check. -lineinfo: sanitizer and profiler lines.
  target_compile_options(attnrun_cuda_kernels PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v -lineinfo -Xcompiler=-Wall,-Wextra>)
  if(ATTN_WERROR)
    target_compile_options(attnrun_cuda_kernels PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
  set(ATTN_PTXAS_LOG_DIR ${CMAKE_BINARY_DIR}/ptxas)
  file(MAKE_DIRECTORY ${ATTN_PTXAS_LOG_DIR})
  set_target_properties(attnrun_cuda_kernels PROPERTIES CUDA_COMPILER_LAUNCHER
    "${CMAKE_COMMAND};-DATTN_PTXAS_LOG_DIR=${ATTN_PTXAS_LOG_DIR};-P;${ATTN_ROOT}/cmake/check_spills.cmake;--")
  target_link_libraries(attnrun_cuda_kernels PUBLIC CUDA::cudart_static)

  # The sm90 instances get an object library of their own with the one architecture their
  # instructions exist on (wgmma, setmaxnreg: sm_90a), the same flags and ptxas reports;
  # without 90a in CMAKE_CUDA_ARCHITECTURES they are left out and dispatch.c never asks.
  if(ATTN_CUDA_SM90_INSTANCES AND "90a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
    add_library(attnrun_cuda_sm90 OBJECT ${ATTN_CUDA_SM90_INSTANCES})
    target_include_directories(attnrun_cuda_sm90 PRIVATE ${ATTN_CUDA_DIR} ${ATTN_ROOT}/include
                               ${ATTN_ROOT}/runtime)
    set_target_properties(attnrun_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES 90a
      CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17
      CUDA_STANDARD_REQUIRED ON CUDA_VISIBILITY_PRESET hidden CUDA_COMPILER_LAUNCHER
      "${CMAKE_COMMAND};-DATTN_PTXAS_LOG_DIR=${ATTN_PTXAS_LOG_DIR};-P;${ATTN_ROOT}/cmake/check_spills.cmake;--")
    set_property(TARGET attnrun_cuda_sm90 PROPERTY COMPILE_OPTIONS "")
    target_compile_options(attnrun_cuda_sm90 PRIVATE -Xptxas=-v -lineinfo -Xcompiler=-Wall,-Wextra)
    if(ATTN_WERROR)
      target_compile_options(attnrun_cuda_sm90 PRIVATE -Werror=all-warnings -Xcompiler=-Werror)
    endif()
    target_sources(attnrun_cuda_kernels PRIVATE $<TARGET_OBJECTS:attnrun_cuda_sm90>)
    target_compile_definitions(attnrun_cuda_kernels PRIVATE ${ATTN_CUDA_SM90_DEFS})
    message(STATUS "attnrun: Hopper (sm_90a TMA + wgmma) forward at head dims "
                   "${ATTN_CUDA_SM90_FWD_DIMS}, backward at ${ATTN_CUDA_SM90_BWD_DIMS}")
  endif()

  if(TARGET attnrun)
    # attnrun existed before CUDA was enabled: give it the architectures for its link and
    # the kernels (the top level adds the runtime adapter, kernels/cuda/backend.c).
    set_target_properties(attnrun PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    target_link_libraries(attnrun PRIVATE attnrun_cuda_kernels)
    target_compile_definitions(attnrun PRIVATE ATTN_HAVE_CUDA=1)
    target_include_directories(attnrun PRIVATE ${ATTN_CUDA_DIR})
    # The device transports: MPI-staged always (ranks sharing a GPU), NCCL when found;
    # cuBLAS for the layer's projections (kernels/cuda/backend.c), in the CUDA part only.
    target_sources(attnrun PRIVATE ${ATTN_ROOT}/comm/staged.c)
    target_link_libraries(attnrun PRIVATE CUDA::cublas)
    if(NCCL_FOUND)
      target_sources(attnrun PRIVATE ${ATTN_ROOT}/comm/nccl.c)
      target_link_libraries(attnrun PRIVATE NCCL::NCCL)
      target_compile_definitions(attnrun PRIVATE ATTN_HAVE_NCCL=1)
    endif()
  endif()
endif()

# ---- tests and benchmarks ------------------------------------------------------------------
# The status table (attn__fail, attn_last_error) and the float64 oracle, for test and
# benchmark programs that link the kernels without libattnrun.
if(ATTN_BUILD_TESTS OR (ATTN_BUILD_BENCH AND ATTN_CUDA_ENABLED))
  add_library(attn_cuda_status STATIC ${ATTN_ROOT}/runtime/status.c)
  target_include_directories(attn_cuda_status PUBLIC ${ATTN_ROOT}/include PRIVATE ${ATTN_ROOT}/runtime)
  if(NOT TARGET attnrun_ref)
    add_library(attnrun_ref STATIC ${ATTN_ROOT}/kernels/ref/ref.c)
    target_include_directories(attnrun_ref PUBLIC ${ATTN_ROOT}/include ${ATTN_ROOT}/kernels/ref)
    target_link_libraries(attnrun_ref PUBLIC m)
  endif()
  # attnrun_cuda_api: what a GPU test or benchmark program links for the kernels'
  # interface (cuda_attn.h): libattnrun, which exports it, so that the ~20 MB kernel fatbin
  # exists once per build (and once in the GPU bundle), not once per program; a project
  # without libattnrun (tests/gpu/standalone) gets the static kernels and the status table.
  if(ATTN_CUDA_ENABLED)
    add_library(attnrun_cuda_api INTERFACE)
    target_include_directories(attnrun_cuda_api INTERFACE ${ATTN_CUDA_DIR} ${ATTN_ROOT}/include)
    if(TARGET attnrun)
      target_link_libraries(attnrun_cuda_api INTERFACE attnrun)
    else()
      target_link_libraries(attnrun_cuda_api INTERFACE attnrun_cuda_kernels attn_cuda_status)
    endif()
  endif()
endif()
if(ATTN_BUILD_TESTS)
  enable_testing()
  add_subdirectory(${ATTN_ROOT}/tests/gpu ${CMAKE_BINARY_DIR}/tests/gpu)
endif()
if(ATTN_BUILD_BENCH AND ATTN_CUDA_ENABLED)
  add_subdirectory(${ATTN_ROOT}/bench/gpu ${CMAKE_BINARY_DIR}/bench/gpu)
endif()
