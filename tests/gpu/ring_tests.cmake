# ring_tests.cmake — ring attention on a CUDA context (test_cuda_ring.c), included by
# tests/gpu/CMakeLists.txt where the emulated library exists: the emulated variant (label
# emu, runs in CI) and, with nvcc, the same test against libattnrun (label gpu, exit 77
# without a GPU). One GPU shared by the ranks uses the MPI-staged transport.
set(attn_ring_env "OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")

# attn_gpu_mpi_test(<name> <np> <label> <timeout> <exe> <part> [ENV k=v...])
function(attn_gpu_mpi_test name np label timeout exe part)
  cmake_parse_arguments(T "" "" "ENV" ${ARGN})
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   --bind-to none $<TARGET_FILE:${exe}> ${part})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${timeout} LABELS ${label}
                       ENVIRONMENT "${attn_ring_env};${T_ENV}")
endfunction()

add_executable(test_cuda_ring_emu test_cuda_ring.c)
target_compile_definitions(test_cuda_ring_emu PRIVATE ATTN_TEST_EMULATED)
target_link_libraries(test_cuda_ring_emu PRIVATE attnrun_emu attn_test_util MPI::MPI_C m)
set_target_properties(test_cuda_ring_emu PROPERTIES LINKER_LANGUAGE CXX)
foreach(np 1 2 3)
  attn_gpu_mpi_test(cuda_emu_ring_np${np} ${np} emu 300 test_cuda_ring_emu ring)
endforeach()
# No NCCL in the emulated build: forcing it must fail on every rank, with the reason.
attn_gpu_mpi_test(cuda_emu_ring_refuse_nccl_np2 2 emu 60 test_cuda_ring_emu refuse ENV ATTN_COMM=nccl)

if(ATTN_CUDA_ENABLED)
  add_executable(test_cuda_ring test_cuda_ring.c)
  target_link_libraries(test_cuda_ring PRIVATE attnrun attn_test_util MPI::MPI_C m)
  foreach(np 2 3)
    attn_gpu_mpi_test(cuda_ring_np${np} ${np} gpu 300 test_cuda_ring ring)
  endforeach()
  # NCCL forced: runs on one rank; on two it needs two GPUs (one GPU: skipped, exit 77).
  foreach(np 1 2)
    attn_gpu_mpi_test(cuda_ring_nccl_np${np} ${np} gpu 300 test_cuda_ring ring ENV ATTN_COMM=nccl)
  endforeach()
endif()

# The TP layer on a CUDA context (test_cuda_layer.c) vs the CPU layer and the float64
# reference of tests/mpi/test_layer_ref.c: tp-only, cp-only (the ring inside the layer).
set(attn_layer_ref ${ATTN_ROOT}/tests/mpi/test_layer_ref.c)
add_executable(test_cuda_layer_emu test_cuda_layer.c ${attn_layer_ref})
target_include_directories(test_cuda_layer_emu PRIVATE ${ATTN_ROOT}/tests/mpi)
target_compile_definitions(test_cuda_layer_emu PRIVATE ATTN_TEST_EMULATED)
target_link_libraries(test_cuda_layer_emu PRIVATE attnrun_emu attnrun_ref attn_test_util MPI::MPI_C m)
set_target_properties(test_cuda_layer_emu PROPERTIES LINKER_LANGUAGE CXX)
foreach(grid "1;1;1" "2;2;1" "2;1;2")
  list(GET grid 0 np)
  list(GET grid 1 tp)
  list(GET grid 2 cp)
  attn_gpu_mpi_test(cuda_emu_layer_tp${tp}_cp${cp} ${np} emu 300 test_cuda_layer_emu "${tp};${cp}")
endforeach()

if(ATTN_CUDA_ENABLED)
  add_executable(test_cuda_layer test_cuda_layer.c ${attn_layer_ref})
  target_include_directories(test_cuda_layer PRIVATE ${ATTN_ROOT}/tests/mpi)
  target_link_libraries(test_cuda_layer PRIVATE attnrun attnrun_ref attn_test_util MPI::MPI_C m)
  foreach(grid "1;1;1" "2;2;1" "2;1;2" "4;2;2")
    list(GET grid 0 np)
    list(GET grid 1 tp)
    list(GET grid 2 cp)
    attn_gpu_mpi_test(cuda_layer_tp${tp}_cp${cp} ${np} gpu 300 test_cuda_layer "${tp};${cp}")
  endforeach()
endif()

# The single-rank public API on a CUDA context (test_cuda_runtime.c, label gpu in
# CMakeLists.txt) on the emulated library too.
add_executable(test_cuda_runtime_emu test_cuda_runtime.c)
target_include_directories(test_cuda_runtime_emu BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/emu_cudart)
target_link_libraries(test_cuda_runtime_emu PRIVATE attnrun_emu m)
target_include_directories(test_cuda_runtime_emu PRIVATE ${ATTN_CUDA_DIR})
set_target_properties(test_cuda_runtime_emu PROPERTIES LINKER_LANGUAGE CXX)
add_test(NAME cuda_emu_runtime COMMAND test_cuda_runtime_emu)
set_tests_properties(cuda_emu_runtime PROPERTIES TIMEOUT 300 LABELS emu)
# and as a compute 9.0 GPU runs it by default, the Hopper kernels on (the emulator's
# default is off): its tile counts follow the kernel family that ran
add_test(NAME cuda_emu_runtime_hopper COMMAND test_cuda_runtime_emu)
set_tests_properties(cuda_emu_runtime_hopper PROPERTIES TIMEOUT 300 LABELS emu
                     ENVIRONMENT ATTN_CUDA_HOPPER=1)

# The emulated runtime's stream / event model itself (emu_cudart/test_emu_cudart.c): the
# deferral that lets the emu tests above show a missing wait.
add_executable(test_emu_cudart emu_cudart/test_emu_cudart.c)
target_include_directories(test_emu_cudart BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/emu_cudart)
target_link_libraries(test_emu_cudart PRIVATE attnrun_emu m)
set_target_properties(test_emu_cudart PROPERTIES LINKER_LANGUAGE CXX)
add_test(NAME cuda_emu_cudart COMMAND test_emu_cudart)
set_tests_properties(cuda_emu_cudart PROPERTIES TIMEOUT 30 LABELS emu)
