# layer.cmake — the tensor-parallel attention layer tests (test_layer.c): against a float64
# reference of the whole layer, exact on the integer path, bitwise over ranks and runs,
# bad configurations failing on every rank; and fault injection inside the layer's
# collectives (a rank exits, is killed or stalls → the job ends non-zero, naming it).
add_executable(test_layer test_layer.c test_layer_ref.c)
target_link_libraries(test_layer PRIVATE attnrun attnrun_ref attn_test_util MPI::MPI_C m)

# attn_layer_grid(<np> <tp> <cp>): every checking part of test_layer on one grid.
function(attn_layer_grid np tp cp)
  foreach(part ref exact bitwise bad)
    attn_mpi_test(layer_${part}_tp${tp}_cp${cp} ${np} test_layer ${part} ${tp} ${cp})
    set_tests_properties(layer_${part}_tp${tp}_cp${cp} PROPERTIES TIMEOUT 60)
  endforeach()
endfunction()

attn_layer_grid(1 1 1)
attn_layer_grid(2 2 1)
attn_layer_grid(3 3 1)
attn_layer_grid(4 4 1)
attn_layer_grid(2 1 2)
attn_layer_grid(3 1 3)
attn_layer_grid(4 2 2)

# attn_layer_fault(<np> <tp> <cp> <ATTN_FAULT> <expect>): the job must end non-zero within
# 30 s, print <expect> (a regex), and leave no process behind. A rank that exits or is
# killed takes the job down through the launcher; a stalled one must be reported by a
# peer's layer call timing out.
function(attn_layer_fault np tp cp fault expect)
  string(REPLACE ":" "_" tag "${fault}")
  set(name layer_fault_${tag}_tp${tp}_cp${cp})
  string(REPLACE ";" "|" launch
         "${MPIEXEC_EXECUTABLE};${MPIEXEC_NUMPROC_FLAG};${np};${ATTN_MPIEXEC_FLAGS}")
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DLAUNCH=${launch}" -DEXE=$<TARGET_FILE:test_layer>
                   "-DARGS=fault|${tp}|${cp}" -DMAX_S=30 "-DEXPECT=${expect}"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_fail.cmake)
  set(env ATTN_FAULT=${fault} ATTN_TIMEOUT=2 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
  set_tests_properties(${name} PROPERTIES TIMEOUT 90 RUN_SERIAL TRUE ENVIRONMENT "${env}")
endfunction()

foreach(action exit kill)
  attn_layer_fault(2 2 1 1:allreduce:5:${action} "world rank 1")
endforeach()
set(peer_saw "layer step [0-9]+: timeout: .*world rank")
attn_layer_fault(2 2 1 1:allreduce:5:stall "${peer_saw} 1 did not answer")
attn_layer_fault(4 2 2 3:ring:1:stall "${peer_saw} [13] did not answer")
