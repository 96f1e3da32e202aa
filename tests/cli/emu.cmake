# emu.cmake — attnrun's CUDA path in CI without a GPU: the CLI's sources linked against the
# emulated libattnrun (tests/gpu: stand-in CUDA runtime, kernels on the CPU emulator) as
# attnrun_emu_cli, and single-rank runs with --backend cuda checked against the float64
# oracle at the dtype's tolerance (label emu). Small shapes: the emulator is slow. The
# multi-rank runs on it are in tests/mpi/cli.cmake.
enable_language(CXX) # the emulated library is C++ (its link needs the C++ runtime)
get_target_property(attn_cli_sources attnrun_cli SOURCES)
get_target_property(attn_cli_dir attnrun_cli SOURCE_DIR)
set(attn_cli_emu_sources "")
foreach(src IN LISTS attn_cli_sources)
  list(APPEND attn_cli_emu_sources ${attn_cli_dir}/${src})
endforeach()
add_executable(attnrun_emu_cli ${attn_cli_emu_sources})
target_include_directories(attnrun_emu_cli PRIVATE ${attn_cli_dir})
target_compile_definitions(attnrun_emu_cli PRIVATE ATTN_GIT_SHA="${ATTN_GIT_SHA}"
                           ATTN_HAVE_OPENBLAS=${ATTN_HAVE_OPENBLAS})
target_link_libraries(attnrun_emu_cli PRIVATE attnrun_emu attnrun_ref MPI::MPI_C
                      PkgConfig::HWLOC OpenMP::OpenMP_C ${ATTN_BLAS_TARGET} m)
set_target_properties(attnrun_emu_cli PROPERTIES LINKER_LANGUAGE CXX)

set(EMU_FAST "--iters|1|--warmup|0|--threads|2|--backend|cuda")
function(cli_emu name)
  cli_expect(emu_${name} 0 ${ARGN} ${EMU_FAST} STDOUT "OK: 0 wrong elements" TIMEOUT 300
             EXE attnrun_emu_cli LABEL emu)
endfunction()
cli_emu(fwd_causal --seq 96 --heads 2 --kv-heads 1 --head-dim 64 --causal --check 8)
cli_emu(bwd_gqa --batch 2 --seq 80 --heads 4 --kv-heads 2 --head-dim 128 --causal --bwd --check 8)
cli_emu(bwd_features --seq 70 --seq-kv 111 --heads 2 --head-dim 64 --window 40,10 --sinks
        --alibi --softcap 20 --bwd --check 8)
cli_emu(bwd_f16_varlen --dtype f16 --varlen 3 --seq 120 --heads 2 --head-dim 64 --causal --bwd
        --check 8)
# empty sequences in the pack: their tiles and key blocks are none on the device too
cli_emu(bwd_varlen_empty --varlen 10,0,5,0 --seq 15 --heads 2 --head-dim 64 --bwd --check 8)
cli_emu(fwd_f32_sparse --dtype f32 --seq 128 --heads 2 --head-dim 64 --causal --check 8
        --sparse local=1,stride=3,global=1,random=1,block=32)
# the TP layer on a device with every spec array (varlen cu_seqlens, sinks, ALiBi slopes): the
# CLI hands them over in device memory, the layer reads its varlen check through host copies
cli_emu(layer_varlen_arrays --varlen 3 --seq 128 --heads 4 --kv-heads 2 --head-dim 128 --causal
        --sinks --alibi --d-model 512 --bwd --check 4)
# a decode step: Sq = 1 against a longer cache, GQA 8/2 (packed GQA and split-KV)
cli_emu(fwd_decode --seq 1 --seq-kv 1500 --heads 8 --kv-heads 2 --head-dim 128 --causal --sinks
        --check 1)
cli_expect(emu_header 0 --seq 64 --heads 2 --head-dim 64 --check 4 --iters 1 --warmup 0
           STDOUT "# backend cuda \\(auto: 1 CUDA device visible\\): cuda, dtype bf16 \\(the default on cuda\\).*OK: 0 wrong"
           TIMEOUT 300 EXE attnrun_emu_cli LABEL emu)
# attn_stats on the cuda backend: S = 256 causal, Hq = 2, head dim 128. Forward (query tiles
# of 128 rows x key tiles of 64): rows 0-127 compute 2 of 4 key tiles, rows 128-255 all 4;
# FLOPs 2*(Dqk+Dv) per (row, key) over the computed range: 2*(128*128 + 128*256)*256 per
# head. Backward (dK/dV: 128 keys x 32-row steps from the first row that sees them): keys
# 0-127 take 8 steps, keys 128-255 4 (rows 128-255) of 8; 2*(3Dqk+2Dv) per pair.
add_test(NAME cli_emu_stats
         COMMAND ${CMAKE_COMMAND} -DATTNRUN=$<TARGET_FILE:attnrun_emu_cli>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/emu_stats
                 "-DRUN_ARGS=--seq|256|--heads|2|--kv-heads|1|--head-dim|128|--causal|--bwd|--check|4|${EMU_FAST}"
                 "-DEXPECT=tiles_computed=12;tiles_skipped=4;flops_computed=50331648;bwd_tiles_computed=24;bwd_tiles_skipped=8;bwd_flops_computed=125829120"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/emu_stats.cmake)
# (counted by hand for the mma.sync kernels' tiles: the Hopper forward, the default on a
# compute 9.0 device, walks others)
set_tests_properties(cli_emu_stats PROPERTIES TIMEOUT 300 LABELS emu ENVIRONMENT ATTN_CUDA_HOPPER=0)
# A KV cache on the cuda backend: paged K/V through a shuffled block table, random used
# lengths (spare pages and rows hold NaN), decode in bf16 (packed GQA, split-KV) and a
# float32 chunk of prefill with used lengths alone.
cli_emu(kv_cache_decode --batch 3 --seq 1 --seq-kv 700 --heads 8 --kv-heads 2 --head-dim 128
        --causal --sinks --page-size 16 --cache-lens random --check 8)
cli_emu(kv_cache_f32 --dtype f32 --batch 2 --seq 20 --seq-kv 200 --heads 2 --head-dim 64
        --causal --window 50,0 --alibi --cache-lens 150,9 --check 8)
# attn_stats of a cache: Hq = 2 (packed: one CTA of both heads), head dim 128, key tiles of
# 64: batch 0 uses 100 keys (2 tiles), batch 1 200 (4 tiles), the row sees all of them;
# FLOPs 2*(128+128) per (row, key): 512 * 300 * 2 heads. Nothing past the used keys counts.
add_test(NAME cli_emu_stats_kv_cache
         COMMAND ${CMAKE_COMMAND} -DATTNRUN=$<TARGET_FILE:attnrun_emu_cli>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/emu_stats_kv_cache
                 "-DRUN_ARGS=--batch|2|--seq|1|--seq-kv|320|--heads|2|--kv-heads|1|--head-dim|128|--causal|--page-size|32|--cache-lens|100,200|--check|2|${EMU_FAST}"
                 "-DEXPECT=tiles_computed=12;tiles_skipped=0;flops_computed=307200" -DTINY=1
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/emu_stats.cmake)
set_tests_properties(cli_emu_stats_kv_cache PROPERTIES TIMEOUT 300 LABELS emu)
