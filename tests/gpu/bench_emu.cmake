# bench_emu.cmake — the GPU benchmarks' every form that tests/gpu/device-check.sh runs, on
# the emulated device (bench_cuda_emu, bench_cuda_decode_emu: tiny shapes), then
# sdpa_bench.py compare on the records: each run must pass its own oracle check (the
# benchmarks exit 1 otherwise), and the comparison must have the rows and tables the
# device check's summary is read for.
# cmake -DBENCH=bench_cuda_emu -DDECODE=bench_cuda_decode_emu -DPYTHON=python3
#       -DSDPA=sdpa_bench.py -DDIR=out -P bench_emu.cmake
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
set(json ${DIR}/bench.jsonl)
set(md ${DIR}/bench.md)
set(small --n 128 --tokens 128 --model-dim 128 --reps 1 --warmup 0 --json ${json})

# decode shapes: GQA packed 4 to a tile, MHA, and MQA (Skv: whole 16-row pages)
set(decode_small --shapes 1/8/2/256,2/4/4/128,1/4/1/384 --reps 1 --warmup 0 --json ${json})

# run NAME ENV ARGS...: bench_cuda_emu with the environment ENV ("A=1;B=2", or "-")
function(run name env)
  set(cmd ${BENCH} ${small} ${ARGN})
  run_cmd(${name} ${env} ${cmd})
endfunction()
# run_decode NAME ENV ARGS...: bench_cuda_decode_emu the same way
function(run_decode name env)
  run_cmd(${name} ${env} ${DECODE} ${decode_small} ${ARGN})
endfunction()
function(run_cmd name env)
  set(cmd ${ARGN})
  if(NOT env STREQUAL "-")
    set(cmd ${CMAKE_COMMAND} -E env ${env} ${cmd})
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "---- ${name}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "bench run '${name}' failed (exit ${rc})")
  endif()
endfunction()

# the device check's stages, in its order (bench-attnrun .. bench-ablate)
run(attnrun - --hd 128,64 --path auto)
run(mma4 "ATTN_CUDA_FWD_WARPS=4" --hd 128,64 --path mma --no-bwd)
run(mma2c "ATTN_CUDA_FWD_CTAS=2" --hd 128,64 --path mma --no-bwd)
run(mma4x32 "ATTN_CUDA_FWD_WARP_ROWS=32" --hd 128,64 --path mma --no-bwd)
run(mma4s "ATTN_CUDA_FWD_STAGES=4;ATTN_CUDA_BWD_STAGES=4" --hd 128,64 --path mma)
run(det - --det --hd 128 --path auto)
run(mma-ablate-0 "ATTN_MMA_ABLATE=0" --hd 128 --path mma --no-bwd)
run(mma-ablate-31 "ATTN_MMA_ABLATE=31" --hd 128 --path mma --no-bwd)
run(dq-atomic "ATTN_SM90_DQ=0" --hd 128,64 --path sm90)
run(ablate-0 "ATTN_SM90_ABLATE=0" --hd 128 --path sm90)
run(ablate-62 "ATTN_SM90_ABLATE=62" --hd 128 --path sm90)
run_decode(decode -)
run_decode(decode-4s "ATTN_CUDA_FWD_STAGES=4")
run_decode(decode-ks "ATTN_CUDA_FWD_KSPLIT=1")
# (one SM here: the planner splits nothing, so a forced split runs the combine too)
run_decode(decode-split "ATTN_CUDA_SPLITS=3")

execute_process(COMMAND ${PYTHON} ${SDPA} compare ${json} --md ${md} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "---- compare: exit ${rc}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "sdpa_bench.py compare failed (exit ${rc})")
endif()
file(READ ${md} text)
# what each stage's records must turn into (impl names agreed between bench_cuda and compare)
foreach(want
    "| fwd | 128 | 128 | no |" "| bwd | 64 | 128 | yes |"
    "| fwd mma 2-CTA | 128 | 128 |" "| fwd mma 4x32 | 64 | 128 |" "| fwd mma 4-stage | 128 | 128 |"
    "| bwd mma 4-stage | 64 | 128 |" "| bwd deterministic | 128 | 128 |"
    "| bwd deterministic (sm90) | 128 | 128 |" "| bwd sm90 dQ by atomics | 64 | 128 |"
    "The sm90 backward with stages left out" "nothing (full kernel) (0)"
    "dQ GEMM + dS barrier + dV+dK GEMMs + P/dS arithmetic + per-step loads (62)"
    "The mma.sync forward with stages left out"
    "K/V loads + tile wait + barrier + QK^T MMAs + online softmax + PV MMAs (31)"
    "Decode steps, bf16, head dim 128"
    # each experiment against its default, over every shape both ran
    "| fwd | attnrun-mma4 | attnrun | 4 |" "| fwd | attnrun-mma2c | attnrun | 4 |"
    "| fwd | attnrun-mma4x32 | attnrun | 4 |" "| fwd | attnrun-mma4s | attnrun | 4 |"
    "| bwd | attnrun-mma4s | attnrun | 4 |" "| bwd | attnrun-sm90 | attnrun | 4 |"
    "| bwd | attnrun-sm90-dqatomic | attnrun-sm90 | 4 |" "| decode | attnrun-4s | attnrun | 3 |"
    "| decode | attnrun-ks | attnrun | 3 |" "| decode | attnrun-plain-ks | attnrun-plain | 3 |")
  string(FIND "${text}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "compare's tables lack '${want}'")
  endif()
endforeach()
# every judged row passed (the ablated ones are not judged), and the main table has the
# 4-warp kernel's column filled at both head dims
foreach(bad "| fail |" "/fail" "fail/" "error")
  string(FIND "${text}" "${bad}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "compare's tables have '${bad}'")
  endif()
endforeach()
string(REGEX MATCHALL "\\| fwd \\| (128|64) \\| 128 \\| (no|yes) \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\|" rows "${text}")
list(LENGTH rows n)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "expected 4 forward rows with the 8-warp, 4-warp and sm90 columns filled, got ${n}")
endif()
# decode rows: attnrun, plain, paged16, 4-stage and key-split ms all filled, for each of the 3 shapes
string(REGEX MATCHALL "\\| [0-9]+ \\| [0-9]+ \\| [0-9]+ \\| 1 \\| [0-9]+ \\| [0-9.]+ \\| [0-9]+ x [0-9]+ \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\|"
       rows "${text}")
list(LENGTH rows n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 decode rows with the planned, plain, paged16, 4-stage and key-split times, got ${n}")
endif()
message(STATUS "bench_emu: 15 bench runs and their comparison as the device check reads them")
