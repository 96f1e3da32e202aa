# cmake/check_spills.cmake — ptxas resource reports of the CUDA kernels, two modes:
#
#  compiler launcher (CUDA_COMPILER_LAUNCHER of attnrun_cuda_kernels):
#    cmake -DATTN_PTXAS_LOG_DIR=<dir> -P check_spills.cmake -- <nvcc command...>
#  runs the compile, echoes its output and keeps it in <dir>/<object name>.log;
#
#  check (a CTest, run by CI after the build):
#    cmake -DATTN_PTXAS_LOG_DIR=<dir> -P check_spills.cmake
#  prints registers / stack / spills per kernel and architecture and fails when a flash_*
#  kernel spills (spill stores or loads > 0; flash_fwd4x32_*, an experiment off by default
#  — ATTN_CUDA_FWD_WARP_ROWS=32, kernels/cuda/README.md — may spill up to 256 B each way:
#  ptxas keeps 128 O + 64 S registers and spills loop-invariant row bounds and addresses,
#  read a few times a key tile), when ptxas serialised wgmma instructions
#  ("Potential Performance Loss: wgmma...": the Hopper kernels' overlap would be gone), when
#  a *_sm90 kernel does not get exactly 168 registers (setmaxnreg moves 128 x 40 + 256 x 232
#  = 64512 = 384 x 168 of the launch's registers: with fewer, setmaxnreg.inc waits forever),
#  or when no report is there to read.
cmake_minimum_required(VERSION 3.25)

if(NOT ATTN_PTXAS_LOG_DIR)
  message(FATAL_ERROR "check_spills.cmake: set -DATTN_PTXAS_LOG_DIR=<dir>")
endif()

# ---- launcher mode --------------------------------------------------------------------------
set(cmd "")
set(seen_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 0 ${last})
  if(seen_dashes)
    list(APPEND cmd "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_dashes TRUE)
  endif()
endforeach()

if(seen_dashes)
  set(obj "unknown")
  list(LENGTH cmd n)
  math(EXPR n1 "${n} - 1")
  foreach(i RANGE 0 ${n1})
    list(GET cmd ${i} a)
    if(a STREQUAL "-o" AND i LESS n1)
      math(EXPR j "${i} + 1")
      list(GET cmd ${j} obj)
    endif()
  endforeach()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(out)
    execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${out}")
  endif()
  if(err)
    message("${err}")
  endif()
  get_filename_component(name "${obj}" NAME)
  file(WRITE "${ATTN_PTXAS_LOG_DIR}/${name}.log" "${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "compile of ${name} failed (${rc})")
  endif()
  return()
endif()

# ---- check mode -----------------------------------------------------------------------------
file(GLOB logs "${ATTN_PTXAS_LOG_DIR}/*.log")
if(NOT logs)
  message(FATAL_ERROR "no ptxas reports in ${ATTN_PTXAS_LOG_DIR}: build attnrun_cuda_kernels first")
endif()
set(bad "")
set(allowed_spills "")
set(table "")
set(count 0)
foreach(log IN LISTS logs)
  file(STRINGS "${log}" lines)
  set(kernel "")
  set(arch "")
  set(spill "")
  foreach(line IN LISTS lines)
    if(line MATCHES "Potential Performance Loss: wgmma")
      get_filename_component(obj "${log}" NAME_WE)
      string(APPEND bad "  ${obj}: ${line}\n")
    elseif(line MATCHES "Compiling entry function '([^']+)' for '([^']+)'")
      set(kernel "${CMAKE_MATCH_1}")
      set(arch "${CMAKE_MATCH_2}")
    elseif(line MATCHES "([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads")
      set(stack "${CMAKE_MATCH_1}")
      set(stores "${CMAKE_MATCH_2}")
      set(loads "${CMAKE_MATCH_3}")
    elseif(line MATCHES "Used ([0-9]+) registers" AND kernel)
      set(regs "${CMAKE_MATCH_1}")
      string(APPEND table "  ${kernel} ${arch}: ${regs} registers, ${stack} B stack, ${stores} B spill stores, ${loads} B spill loads\n")
      math(EXPR count "${count} + 1")
      set(allowed 0)
      if(kernel MATCHES "^flash_fwd4x32_")
        set(allowed 256)
      endif()
      if(kernel MATCHES "^flash_" AND (stores GREATER allowed OR loads GREATER allowed))
        string(APPEND bad "  ${kernel} (${arch}): ${stores} B spill stores, ${loads} B spill loads\n")
      elseif(kernel MATCHES "^flash_" AND (stores GREATER 0 OR loads GREATER 0))
        string(APPEND allowed_spills "  ${kernel} (${arch}): ${stores} B spill stores, ${loads} B spill loads (up to ${allowed} B allowed)\n")
      endif()
      if(kernel MATCHES "^flash_.*_sm90$" AND NOT regs EQUAL 168)
        string(APPEND bad "  ${kernel} (${arch}): ${regs} registers at launch, not the 168 its setmaxnreg split needs\n")
      endif()
      set(kernel "")
    endif()
  endforeach()
endforeach()
message("ptxas report of ${count} kernel compilations:\n${table}")
if(count EQUAL 0)
  message(FATAL_ERROR "the ptxas reports hold no kernels (was -Xptxas=-v dropped?)")
endif()
if(bad)
  message(FATAL_ERROR "flash kernels spill, serialise wgmma or miss their register split:\n${bad}")
endif()
if(allowed_spills)
  message("experiments' spills within their allowance:\n${allowed_spills}")
endif()
message("no flash kernel spills past its allowance, no serialised wgmma, sm90 kernels at 168 registers")
