# split_kv.cmake — attnrun --mode split-kv under mpiexec (context-parallel decode: every CP
# rank holds all query rows and a cut of K/V): --check against the float64 oracle for
# decode, a few query rows, a prefill, every flag, bf16, a tp x cp grid and the device
# path's copies; auto picks it for few queries; --save equals one rank's files; refusals;
# a stalled peer ends the job; the CUDA path on the emulated runtime. Uses cli.cmake's
# helpers (cli_mpi, cli_mpi_check, cli_mpi_save, cli_mpi_fault).
cli_mpi_check(split_decode_np4 4 --mode split-kv --seq 1 --seq-kv 2000 --heads 8 --kv-heads 2
              --head-dim 64 --causal --sinks --bwd --check 8)
cli_mpi_check(split_features_np2 2 --mode split-kv --batch 2 --seq 7 --seq-kv 900 --heads 6
              --kv-heads 2 --head-dim 48 --window 300,0 --alibi --softcap 20 --bwd --check 8)
cli_mpi_check(split_varlen_np3 3 --mode split-kv --varlen 3 --seq 6 --seq-kv 600 --heads 2
              --head-dim 32 --causal --sinks --bwd --check 8)
cli_mpi_check(split_sparse_np2 2 --mode split-kv --seq 64 --seq-kv 512 --heads 2 --head-dim 32
              --causal --sparse local=1,global=1,block=32 --bwd --check 8)
cli_mpi_check(split_bf16_np3 3 --mode split-kv --dtype bf16 --seq 5 --seq-kv 3000 --heads 4
              --kv-heads 1 --head-dim 128 --causal --sinks --bwd --check 8)
cli_mpi_check(split_grid_2x2_np4 4 --mode split-kv --tp 2 --cp 2 --seq 3 --seq-kv 1000 --heads 4
              --kv-heads 2 --head-dim 64 --causal --bwd --check 8)
# tp x split-kv with a KV head shared by both TP ranks (its dK/dV summed over them).
cli_mpi_check(split_grid_replicated_kv_np4 4 --mode split-kv --tp 2 --cp 2 --seq 2 --seq-kv 800
              --heads 4 --kv-heads 1 --head-dim 64 --causal --sinks --bwd --check 8)
cli_mpi_check(split_one_rank_np1 1 --mode split-kv --seq 2 --seq-kv 300 --heads 2 --head-dim 32
              --causal --bwd --check 8)
# A causal prefill over more rows than a chunk: zigzag.
cli_mpi(mpi_cli_split_prefill_np4 4 0 --mode split-kv --seq 384 --heads 4 --kv-heads 2
        --head-dim 32 --causal --bwd --check 8 ${CLI_MPI_FAST}
        STDOUT "layout zigzag \\(split-kv, causal.*OK: 0 wrong elements")
cli_mpi(mpi_cli_split_ctx_copies_np2 2 0 --mode split-kv --seq 3 --seq-kv 500 --heads 4
        --kv-heads 2 --head-dim 32 --causal --sinks --bwd --check 8 ${CLI_MPI_FAST}
        STDOUT "OK: 0 wrong elements" ENV_VARS "ATTNRUN_CTX_COPIES=1")

# ---- auto: split-kv for queries too few to cut, or states smaller than the ring's K/V --
cli_mpi(mpi_cli_split_auto_decode_np3 3 0 --seq 1 --seq-kv 40000 --heads 4 --kv-heads 1
        --head-dim 32 --causal --check 4 ${CLI_MPI_FAST}
        STDOUT "mode split-kv .*too few to cut over cp=3.*OK: 0 wrong elements")
cli_mpi(mpi_cli_split_auto_bytes_np2 2 0 --seq 64 --seq-kv 40000 --heads 8 --kv-heads 1
        --head-dim 64 --causal --check 4 ${CLI_MPI_FAST}
        STDOUT "mode split-kv .*states .* are smaller than the K/V the ring carries.*OK: 0 wrong")
cli_mpi(mpi_cli_split_auto_stays_ring_np2 2 0 --seq 40000 --heads 2 --head-dim 32 --causal
        --window 256,0 --check 4 ${CLI_MPI_FAST} STDOUT "mode ring .*OK: 0 wrong elements")
cli_mpi(mpi_cli_split_json_np2 2 0 --mode split-kv --seq 2 --seq-kv 256 --heads 2 --head-dim 32
        --bwd --check 4 ${CLI_MPI_FAST} JSON_KEYS "mode|cp|layout|per_rank.1.fwd_sent_bytes")

# ---- refusals: exit 2 on every rank, with what to change --------------------------------
cli_mpi(mpi_cli_split_ring_hint_np4 4 2 --mode ring --seq 2 --seq-kv 64 --heads 2
        STDERR "shorter than the 4 chunks.*or --mode split-kv" MAX_S 20)
cli_mpi(mpi_cli_split_few_keys_np4 4 2 --mode split-kv --seq 1 --seq-kv 3 --heads 2
        STDERR "split-kv: the keys \\(Skv=3\\) are fewer than the 4 chunks" MAX_S 20)
cli_mpi(mpi_cli_split_layer_np2 2 2 --mode split-kv --d-model 64 --seq 64 --heads 2
        --head-dim 16 STDERR "split-kv runs attention alone" MAX_S 20)
cli_mpi(mpi_cli_split_bad_mode_np1 1 2 --mode splitkv
        STDERR "--mode 'splitkv': expected tp, ring, split-kv or auto" MAX_S 20)

# ---- --save: the files of one rank (query-side arrays written once, by CP rank 0) --------
cli_mpi_save(split_np3 3 "--seq|5|--seq-kv|600|--heads|4|--kv-heads|2|--head-dim|32|--causal|--sinks|--bwd"
             "--mode|split-kv" "--causal|--sinks|--bwd" "${SAVE_OUT}|dsinks.npy" "")

# ---- a stalled peer in the gather ends the job ------------------------------------------
cli_mpi_fault(split_stall_np2 2 770007 1:ring:0:stall "--mode;split-kv")
cli_mpi_fault(split_kill_np3 3 770008 1:ring:0:kill "--mode;split-kv")

# ---- the CUDA path: emulated (label emu) and on a GPU (label gpu; skipped without one) --
if(TARGET attnrun_emu_cli)
  cli_mpi(mpi_cli_emu_split_np2 2 0 --mode split-kv --seq 3 --seq-kv 256 --heads 2 --kv-heads 1
          --head-dim 64 --causal --sinks --bwd --check 8 ${CLI_EMU_FAST}
          STDOUT "OK: 0 wrong elements" EXE attnrun_emu_cli LABEL emu)
endif()
cli_mpi(mpi_cli_gpu_split_np2 2 0 --mode split-kv --seq 4 --seq-kv 4096 --heads 8 --kv-heads 2
        --head-dim 128 --causal --sinks --bwd --check 8 ${CLI_MPI_GPU}
        STDOUT "OK: 0 wrong elements" GPU)
