# expect_fail.cmake — runs a job that must fail, for fault-injection tests: it has to end
# with a non-zero exit within MAX_S seconds, print EXPECT (a regex) somewhere, and leave no
# process of it behind. Lists use '|' instead of ';'.
#   cmake -DLAUNCH="mpiexec|-n|3|--oversubscribe" -DEXE=<program> -DARGS="a|b" -DMAX_S=30
#         -DEXPECT="world rank 1" -P expect_fail.cmake
string(REPLACE "|" ";" launch "${LAUNCH}")
string(REPLACE "|" ";" args "${ARGS}")

string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${launch} ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out TIMEOUT ${MAX_S})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("---- output (${elapsed} s, exit '${rc}') ----\n${out}---- end of output ----")

set(problems "")
if(NOT rc MATCHES "^[0-9]+$")
  string(APPEND problems "the job did not end by itself within ${MAX_S} s (${rc}); ")
elseif(rc EQUAL 0)
  string(APPEND problems "the job exited 0 but had to fail; ")
endif()
if(EXPECT AND NOT out MATCHES "${EXPECT}")
  string(APPEND problems "the output does not mention '${EXPECT}'; ")
endif()

# Orphans: processes whose command line is this program with these arguments (the ranks,
# or the launcher). This script's own command line holds them joined by '|', not spaces.
find_program(PGREP pgrep)
if(PGREP)
  get_filename_component(exe_name "${EXE}" NAME)
  string(REPLACE ";" " " args_sp "${args}")
  set(pattern "(^|/)${exe_name} ${args_sp}( |$)")
  foreach(try RANGE 10)
    execute_process(COMMAND ${PGREP} -f "${pattern}" OUTPUT_VARIABLE pids RESULT_VARIABLE prc)
    if(NOT prc EQUAL 0)
      break()
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 0.5)
  endforeach()
  if(prc EQUAL 0)
    string(REPLACE "\n" " " pids "${pids}")
    string(APPEND problems "processes left behind: ${pids}(killed now); ")
    separate_arguments(pid_list UNIX_COMMAND "${pids}")
    execute_process(COMMAND kill -9 ${pid_list})
  endif()
else()
  message("pgrep not found: orphan check skipped")
endif()

if(problems)
  message(FATAL_ERROR "expect_fail: ${problems}")
endif()
message("expect_fail: OK — exit ${rc} after ${elapsed} s, '${EXPECT}' reported, no process left")
