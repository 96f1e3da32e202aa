# ring.cmake — ring and split-KV attention tests: attn_ring_fwd/bwd and
# attn_split_kv_fwd/bwd == single-rank attn_fwd/bwd on 1-4 ranks (oversubscribed, one
# thread each), the step record, and ranks that disagree.
add_executable(test_ring test_ring.c test_ring_split.c)
target_link_libraries(test_ring PRIVATE attnrun attn_test_util MPI::MPI_C m)
foreach(np 1 2 3 4)
  foreach(part basic features varlen random errors split split_random)
    attn_mpi_test(ring_${part}_np${np} ${np} test_ring ${part})
  endforeach()
endforeach()
