# cli.cmake — attnrun under mpiexec (-np 1..4, oversubscribed; cpu backend unless a test
# says cuda, label gpu): --check against the
# float64 oracle in ring mode (zigzag and contiguous, causal, window, GQA, features), TP
# mode, a 2 x 2 tp x cp grid and the TP layer; --save under mpiexec equals one rank's
# files (inputs bitwise, outputs within 1e-5, bitwise in TP mode) and --load reads them
# back; bad flags and impossible grids end every rank with exit 2, quickly; fault
# injection (ATTN_FAULT) in a ring step and in the layer's allreduce ends the job within
# the timeout plus a few seconds, non-zero, naming the rank, with nothing left behind.
add_executable(cli_npy_compare ${CMAKE_CURRENT_SOURCE_DIR}/cli_npy_compare.c
                               ${PROJECT_SOURCE_DIR}/launch/npy.c
                               ${PROJECT_SOURCE_DIR}/launch/err.c)
target_include_directories(cli_npy_compare PRIVATE ${PROJECT_SOURCE_DIR}/launch)
target_link_libraries(cli_npy_compare PRIVATE m)

set(CLI_MPI_ENV "OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
set(CLI_MPI_WORK ${CMAKE_CURRENT_BINARY_DIR}/cli_work)
file(MAKE_DIRECTORY ${CLI_MPI_WORK})
# Short runs: one timed iteration, no warmup, on the cpu backend whatever the machine has
# (the GPU tests below say --backend cuda).
set(CLI_MPI_FAST "--iters|1|--warmup|0|--backend|cpu")
set(CLI_MPI_GATE ${PROJECT_SOURCE_DIR}/tests/cli/gpu_gate.sh)

function(cli_mpi_launch out np)
  string(REPLACE ";" "|" l "${MPIEXEC_EXECUTABLE};${MPIEXEC_NUMPROC_FLAG};${np};${ATTN_MPIEXEC_FLAGS}")
  set(${out} "${l}" PARENT_SCOPE)
endfunction()

# cli_mpi(name np rc args... [STDOUT re] [STDERR re] [MAX_S s] [ORPHANS pat] [ENV_VARS "A=1|B=2"]
#         [JSON_KEYS "k1|k2"] [GPU])
# GPU: label gpu, skipped (exit 77) unless attnrun sees a CUDA device.
function(cli_mpi name np rc)
  cmake_parse_arguments(T "GPU" "STDOUT;STDERR;MAX_S;ORPHANS;ENV_VARS;JSON_KEYS;EXE;LABEL" "" ${ARGN})
  cli_mpi_launch(launch ${np})
  set(args ${T_UNPARSED_ARGUMENTS})
  if(NOT T_EXE)
    set(T_EXE attnrun_cli)
  endif()
  set(defs "-DLAUNCH=${launch}" -DEXE=$<TARGET_FILE:${T_EXE}> -DEXPECT_RC=${rc})
  if(T_JSON_KEYS)
    set(json ${CLI_MPI_WORK}/${name}.jsonl)
    list(APPEND args --json ${json})
    list(APPEND defs "-DJSON_FILE=${json}" "-DJSON_KEYS=${T_JSON_KEYS}")
  endif()
  string(JOIN "|" args_bar ${args})
  list(APPEND defs "-DARGS=${args_bar}")
  foreach(opt STDOUT STDERR)
    if(DEFINED T_${opt})
      list(APPEND defs "-D${opt}_REGEX=${T_${opt}}")
    endif()
  endforeach()
  foreach(opt MAX_S ORPHANS ENV_VARS)
    if(DEFINED T_${opt})
      list(APPEND defs "-D${opt}=${T_${opt}}")
    endif()
  endforeach()
  set(cmd ${CMAKE_COMMAND} ${defs} -P ${CMAKE_CURRENT_SOURCE_DIR}/cli_expect.cmake)
  if(T_GPU)
    set(cmd sh ${CLI_MPI_GATE} --with $<TARGET_FILE:attnrun_cli> ${cmd})
  endif()
  add_test(NAME ${name} COMMAND ${cmd})
  set_tests_properties(${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "${CLI_MPI_ENV}")
  if(T_GPU)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS gpu TIMEOUT 300)
  elseif(T_LABEL)
    set_tests_properties(${name} PROPERTIES LABELS ${T_LABEL} TIMEOUT 300)
  endif()
endfunction()

# ---- --check: every rank's sampled rows against the oracle over the full sequence ------
function(cli_mpi_check name np)
  cli_mpi(mpi_cli_check_${name} ${np} 0 ${ARGN} ${CLI_MPI_FAST} STDOUT "OK: 0 wrong elements")
endfunction()
set(RING_GQA --seq 384 --heads 4 --kv-heads 2 --head-dim 32 --causal --bwd --check 8)
foreach(np 1 2 3 4)
  cli_mpi_check(ring_zigzag_np${np} ${np} --mode ring --layout zigzag ${RING_GQA})
endforeach()
cli_mpi_check(ring_contiguous_np2 2 --mode ring --layout contiguous ${RING_GQA})
cli_mpi_check(ring_contiguous_np3 3 --mode ring --layout contiguous ${RING_GQA})
cli_mpi_check(ring_window_np4 4 --mode ring --seq 1000 --heads 2 --head-dim 64 --causal
              --window 100,0 --bwd --check 8)
cli_mpi_check(ring_mqa_features_np3 3 --mode ring --seq 333 --heads 3 --kv-heads 1
              --head-dim 48 --window 64,16 --softcap 20 --alibi --sinks --bwd --check 8)
cli_mpi_check(ring_noncausal_np2 2 --mode ring --seq 256 --heads 2 --head-dim 64 --bwd --check 8)
cli_mpi_check(ring_varlen_np2 2 --mode ring --varlen 3 --seq 300 --heads 2 --head-dim 32 --causal
              --bwd --check 8)
cli_mpi_check(ring_sparse_np3 3 --mode ring --seq 512 --heads 2 --head-dim 32 --causal --bwd
              --check 8 --sparse local=1,stride=3,global=1,random=1,block=32)
cli_mpi_check(ring_sq_lt_skv_np3 3 --mode ring --seq 100 --seq-kv 1000 --batch 2 --heads 2
              --head-dim 32 --causal --bwd --check 8)
cli_mpi_check(ring_bf16_np3 3 --mode ring --dtype bf16 --seq 333 --heads 3 --kv-heads 1
              --head-dim 48 --causal --window 64,16 --sinks --bwd --check 8)
cli_mpi_check(ring_f16_np2 2 --mode ring --layout contiguous --dtype f16 ${RING_GQA})
cli_mpi_check(grid_2x2_bf16_np4 4 --tp 2 --cp 2 --dtype bf16 --seq 384 --heads 4 --kv-heads 2
              --head-dim 32 --causal --alibi --bwd --check 8)
cli_mpi_check(tp_np2 2 --mode tp --seq 256 --heads 4 --kv-heads 2 --head-dim 32 --causal --bwd --check 8)
cli_mpi_check(tp_replicated_kv_np4 4 --mode tp --seq 256 --heads 4 --kv-heads 2 --head-dim 32
              --causal --sinks --bwd --check 8)
cli_mpi_check(grid_2x2_np4 4 --tp 2 --cp 2 --seq 384 --heads 4 --kv-heads 2 --head-dim 32 --causal
              --bwd --check 8)
cli_mpi_check(auto_np4 4 --seq 256 --heads 4 --head-dim 32 --causal --check 8)
cli_mpi_check(layer_tp_np2 2 --mode tp --d-model 64 --seq 192 --heads 4 --head-dim 16 --causal
              --bwd --check 4)
cli_mpi_check(layer_2x2_np4 4 --tp 2 --cp 2 --d-model 64 --seq 192 --heads 4 --kv-heads 2
              --head-dim 16 --causal --bwd --check 4)
# The device path's copies on the cpu backend (ATTNRUN_CTX_COPIES): ring, TP and the layer.
cli_mpi(mpi_cli_ctx_copies_ring_np2 2 0 --mode ring ${RING_GQA} --sinks ${CLI_MPI_FAST}
        STDOUT "OK: 0 wrong elements" ENV_VARS "ATTNRUN_CTX_COPIES=1")
cli_mpi(mpi_cli_ctx_copies_tp_np2 2 0 --mode tp --seq 256 --heads 4 --kv-heads 1 --head-dim 32
        --causal --bwd --check 8 ${CLI_MPI_FAST} STDOUT "OK: 0 wrong elements"
        ENV_VARS "ATTNRUN_CTX_COPIES=1")
cli_mpi(mpi_cli_ctx_copies_layer_np2 2 0 --mode tp --d-model 64 --seq 128 --heads 4 --head-dim 16
        --causal --bwd --check 4 ${CLI_MPI_FAST} STDOUT "OK: 0 wrong elements"
        ENV_VARS "ATTNRUN_CTX_COPIES=1")
# The checker catches a wrong element on one rank: exit 3 on every rank.
cli_mpi(mpi_cli_check_catches_wrong_np3 3 3 --mode ring --seq 192 --heads 2 --head-dim 32 --bwd
        --check 4 ${CLI_MPI_FAST} STDOUT "FAILED: [1-9][0-9]* wrong elements \\(on rank 2\\)"
        ENV_VARS "ATTNRUN_CHECK_SELFTEST=1")
# --json: the record carries the grid and every rank's split.
cli_mpi(mpi_cli_json_np2 2 0 --mode ring --seq 256 --heads 2 --head-dim 32 --causal --bwd --check 4
        ${CLI_MPI_FAST} JSON_KEYS "ranks|tp|cp|layout|time_s|imbalance|exposed_frac|wrong|per_rank.1.fwd_compute_s|per_rank.1.fwd_exposed_s|per_rank.1.bwd_sent_bytes|per_rank.1.cpuset|per_rank.1.peak_rss_bytes")

# ---- --save / --load under mpiexec: the files of one rank ------------------------------
# args: the problem (one rank and the job); grid: the job's grid flags; load_args: the
# job's flags with --load (no shape flags).
function(cli_mpi_save name np args grid load_args outputs exact)
  cli_mpi_launch(launch ${np})
  add_test(NAME mpi_cli_save_${name}
           COMMAND ${CMAKE_COMMAND} -DATTNRUN=$<TARGET_FILE:attnrun_cli>
                   -DCOMPARE=$<TARGET_FILE:cli_npy_compare> "-DLAUNCH=${launch}"
                   -DWORK=${CLI_MPI_WORK}/save_${name} "-DARGS=${args}|${CLI_MPI_FAST}"
                   "-DGRID=${grid}" "-DLOAD_ARGS=${grid}|${load_args}|${CLI_MPI_FAST}"
                   "-DINPUTS=q.npy|k.npy|v.npy|do.npy"
                   "-DOUTPUTS=${outputs}" "-DEXACT=${exact}"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/cli_save.cmake)
  set_tests_properties(mpi_cli_save_${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "${CLI_MPI_ENV}")
endfunction()
set(SAVE_OUT "o.npy|lse.npy|dq.npy|dk.npy|dv.npy")
cli_mpi_save(ring_np3 3 "--seq|300|--heads|4|--kv-heads|2|--head-dim|32|--causal|--bwd"
             "--mode|ring" "--causal|--bwd" "${SAVE_OUT}" "")
cli_mpi_save(grid_2x2_np4 4 "--seq|256|--heads|4|--head-dim|32|--window|50,20|--bwd"
             "--tp|2|--cp|2" "--window|50,20|--bwd" "${SAVE_OUT}" "")
# TP mode runs the single-rank kernels on each rank's heads: bitwise the one-rank files.
cli_mpi_save(tp_np2 2 "--seq|200|--heads|4|--kv-heads|2|--head-dim|32|--causal|--bwd"
             "--mode|tp" "--causal|--bwd" "${SAVE_OUT}" "o.npy,lse.npy,dq.npy,dk.npy,dv.npy")

# ---- bad flags, impossible grids, a refused estimate: exit 2 on every rank, at once ----
cli_mpi(mpi_cli_bad_flag_np3 3 2 --bogus STDERR "unknown flag '--bogus'.*usage:" MAX_S 20)
cli_mpi(mpi_cli_bad_value_np2 2 2 --tp x STDERR "--tp 'x'.*usage:" MAX_S 20)
cli_mpi(mpi_cli_grid_not_divisor_np4 4 2 --tp 3 STDERR "--tp 3 does not divide the 4 ranks.*usage:"
        MAX_S 20)
cli_mpi(mpi_cli_grid_product_np4 4 2 --tp 2 --cp 3 STDERR "tp\\*cp must equal the number of ranks"
        MAX_S 20)
cli_mpi(mpi_cli_grid_heads_np4 4 2 --mode tp --heads 6 STDERR "--heads 6 is not divisible by tp=4"
        MAX_S 20)
cli_mpi(mpi_cli_grid_kv_heads_np4 4 2 --mode tp --heads 12 --kv-heads 3 --seq 64
        STDERR "--kv-heads 3 cannot be shared by tp=4" MAX_S 20)
cli_mpi(mpi_cli_grid_short_seq_np4 4 2 --mode ring --seq 6 --causal --layout zigzag
        STDERR "shorter than the 8 chunks" MAX_S 20)
cli_mpi(mpi_cli_grid_short_seq_contig_np4 4 2 --mode ring --seq 3 --causal
        STDERR "shorter than the 4 chunks" MAX_S 20)
# Causal with fewer rows than zigzag's 2cp chunks: the default layout is contiguous.
cli_mpi(mpi_cli_grid_short_causal_np4 4 0 --mode ring --seq 6 --causal --bwd --check 4 --iters 1
        --warmup 0 STDOUT "layout contiguous \\(causal, but the sequence has fewer rows" MAX_S 60)
cli_mpi(mpi_cli_refuse_np2 2 2 --backend cpu --seq 1M --heads 8 --head-dim 128 --causal
        STDOUT "# estimate: .*per forward call" STDERR "would take ~.*--window.*--force" MAX_S 30)

# ---- a call that fails on every rank (as the ring and the layer do on a CUDA context
# until they take device tensors): the lowest rank's message, exit 1 on every rank, quickly.
cli_mpi(mpi_cli_lib_error_ring_np2 2 1 --mode ring --seq 64 --heads 2 --head-dim 300 ${CLI_MPI_FAST}
        STDERR "rank 0 .*attn_ring_fwd failed: .*head_dim_qk=300" MAX_S 30)
cli_mpi(mpi_cli_lib_error_tp_np2 2 1 --mode tp --seq 64 --heads 2 --head-dim 300 ${CLI_MPI_FAST}
        STDERR "rank 0 .*attn_fwd failed: .*head_dim_qk=300" MAX_S 30)

# ---- on CUDA devices (label gpu; skipped without one): ranks pick the nearest device, may
# share it; TP runs the single-rank kernels per rank; the ring needs the library's ring on
# device tensors (until then: its UNSUPPORTED message and exit 1 on every rank).
set(CLI_MPI_GPU --iters 1 --warmup 0 --backend cuda)
cli_mpi(mpi_cli_gpu_tp_np2 2 0 --mode tp --seq 256 --heads 4 --kv-heads 2 --head-dim 64 --causal
        --bwd --check 8 ${CLI_MPI_GPU} STDOUT "# backend cuda.*cuda:[0-9]+ .*OK: 0 wrong elements" GPU)
cli_mpi(mpi_cli_gpu_ring_np2 2 0 --mode ring --seq 384 --heads 4 --kv-heads 2 --head-dim 64
        --causal --bwd --check 8 ${CLI_MPI_GPU} STDOUT "OK: 0 wrong elements" GPU)
cli_mpi(mpi_cli_gpu_ring_features_np2 2 0 --mode ring --varlen 3 --seq 300 --heads 2 --head-dim 128
        --window 64,16 --sinks --bwd --check 8 ${CLI_MPI_GPU} STDOUT "OK: 0 wrong elements" GPU)
cli_mpi(mpi_cli_gpu_auto_np2 2 0 --seq 256 --heads 4 --head-dim 64 --causal --check 8 --iters 1
        --warmup 0 STDOUT "# backend cuda \\(auto: " GPU)

# ---- fault injection: a rank exits, is killed or stalls; the job ends, nothing is left --
# `seed` is unique per test: the orphan check looks for it in command lines ("[-]-seed" so
# that the pattern does not match the helper's own command line, which holds it).
function(cli_mpi_fault name np seed fault mode_args)
  cli_mpi(mpi_cli_fault_${name} ${np} nonzero ${mode_args} --backend cpu --seq 512 --heads 4 --head-dim 32
          --causal --iters 3 --timeout 3 --seed ${seed} ENV_VARS "ATTN_FAULT=${fault}"
          STDERR "rank 1" MAX_S 20 ORPHANS "attnrun.*[-]-seed ${seed}")
endfunction()
cli_mpi_fault(ring_stall_np2 2 770001 1:ring:1:stall "--mode;ring")
cli_mpi_fault(ring_stall_np3 3 770002 1:ring:1:stall "--mode;ring")
cli_mpi_fault(ring_kill_np3 3 770003 1:ring:1:kill "--mode;ring")
cli_mpi_fault(ring_exit_np4 4 770004 1:ring:0:exit "--mode;ring")
cli_mpi_fault(allreduce_stall_np2 2 770005 1:allreduce:0:stall "--mode;tp;--d-model;64")
cli_mpi_fault(allreduce_kill_np4 4 770006 1:allreduce:1:kill "--tp;2;--cp;2;--d-model;64")

# ---- the CUDA path on the emulated runtime (label emu; runs in CI without a GPU) --------
# attnrun_emu_cli (tests/cli/emu.cmake): the device ring, TP and the layer with their
# device transport (MPI-staged: the ranks share the one emulated device).
if(TARGET attnrun_emu_cli)
  set(CLI_EMU_FAST "--iters|1|--warmup|0|--backend|cuda")
  cli_mpi(mpi_cli_emu_ring_np2 2 0 --mode ring --seq 128 --heads 2 --kv-heads 1 --head-dim 64
          --causal --bwd --check 8 ${CLI_EMU_FAST} STDOUT "OK: 0 wrong elements"
          EXE attnrun_emu_cli LABEL emu)
  cli_mpi(mpi_cli_emu_tp_np2 2 0 --mode tp --seq 96 --heads 4 --kv-heads 2 --head-dim 64
          --causal --bwd --check 8 ${CLI_EMU_FAST} STDOUT "OK: 0 wrong elements"
          EXE attnrun_emu_cli LABEL emu)
  cli_mpi(mpi_cli_emu_layer_np2 2 0 --tp 2 --cp 1 --d-model 128 --seq 64 --heads 2
          --head-dim 64 --causal --bwd --check 4 ${CLI_EMU_FAST} STDOUT "OK: 0 wrong elements"
          EXE attnrun_emu_cli LABEL emu)
endif()
