# comm.cmake — registers the comm/ and group tests: collectives, the ring exchange,
# fingerprint agreement, the tp x cp split and shard layout on 1-4 ranks; the watchdog
# (a stalled rank → ATTN_ERR_TIMEOUT naming it); and fault injection (ATTN_FAULT: a rank
# exits, is killed or stalls inside an allreduce → the job ends non-zero, nothing left).
# The tests compile comm/ and runtime/group.c directly: the library hides attn__ symbols.
set(ATTN_COMM_TEST_SOURCES
    ${PROJECT_SOURCE_DIR}/comm/mpi.c ${PROJECT_SOURCE_DIR}/comm/agree.c ${PROJECT_SOURCE_DIR}/comm/wait.c
    ${PROJECT_SOURCE_DIR}/comm/fault.c ${PROJECT_SOURCE_DIR}/runtime/group.c
    ${PROJECT_SOURCE_DIR}/runtime/status.c)

foreach(exe test_comm test_comm_fault)
  add_executable(${exe} ${CMAKE_CURRENT_SOURCE_DIR}/${exe}.c ${ATTN_COMM_TEST_SOURCES})
  target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/include
                             ${PROJECT_SOURCE_DIR}/runtime ${PROJECT_SOURCE_DIR}/comm)
  target_link_libraries(${exe} PRIVATE MPI::MPI_C m)
endforeach()

foreach(np 1 2 3 4)
  attn_mpi_test(mpi_comm_np${np} ${np} test_comm)
endforeach()
# Messages split into pieces (ATTN_COMM_CHUNK) and struct datatypes: the large-count paths.
attn_mpi_test(mpi_comm_chunked_np3 3 test_comm)
set_property(TEST mpi_comm_chunked_np3 APPEND PROPERTY ENVIRONMENT "ATTN_COMM_CHUNK=1000")

# Watchdog: the last rank does not join; the others must time out (2 s) naming it.
foreach(np 2 3 4)
  foreach(what allreduce exchange)
    attn_mpi_test(mpi_comm_timeout_${what}_np${np} ${np} test_comm_fault timeout-${what})
    set_tests_properties(mpi_comm_timeout_${what}_np${np} PROPERTIES TIMEOUT 60)
  endforeach()
endforeach()
attn_mpi_test(mpi_comm_timeout_create_np2 2 test_comm_fault timeout-create)
set_tests_properties(mpi_comm_timeout_create_np2 PROPERTIES TIMEOUT 60)

# Fault injection: world rank 1 exits / is killed / stalls in its 4th allreduce. The job
# must end non-zero within 30 s, name the rank, and leave no process behind.
string(REPLACE ";" "|" attn_launch "${MPIEXEC_EXECUTABLE};${MPIEXEC_NUMPROC_FLAG};3;${ATTN_MPIEXEC_FLAGS}")
foreach(action exit kill stall)
  set(name mpi_comm_fault_${action}_np3)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DLAUNCH=${attn_launch}" -DEXE=$<TARGET_FILE:test_comm_fault>
                   "-DARGS=fault|${name}" -DMAX_S=30 "-DEXPECT=world rank 1"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_fail.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 90
                       ENVIRONMENT "ATTN_FAULT=1:allreduce:3:${action};ATTN_TIMEOUT=2;OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
