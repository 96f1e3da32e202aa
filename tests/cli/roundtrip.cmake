# roundtrip.cmake — ctest helper: attnrun --save A (generated inputs); the float64 oracle
# recomputes every output in A from A's inputs; attnrun --load A --save B must give
# bitwise-identical outputs.
#   cmake -DATTNRUN=exe -DORACLE=exe -DWORK=dir -DRUN_ARGS="a|b" -DLOAD_ARGS="a|b"
#         -DORACLE_ARGS="a|b" -P roundtrip.cmake
string(REPLACE "|" ";" run_args "${RUN_ARGS}")
string(REPLACE "|" ";" load_args "${LOAD_ARGS}")
string(REPLACE "|" ";" oracle_args "${ORACLE_ARGS}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("---- ${what}: ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed with exit code ${rc}")
  endif()
endfunction()

run_step("generate and save" "${ATTNRUN}" ${run_args} --save "${WORK}/a")
run_step("oracle on the saved files" "${ORACLE}" "${WORK}/a" ${oracle_args})
run_step("load and save again" "${ATTNRUN}" --load "${WORK}/a" ${load_args} --save "${WORK}/b")
foreach(f o lse dq dk dv dsinks q k v)
  if(EXISTS "${WORK}/a/${f}.npy")
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORK}/a/${f}.npy" "${WORK}/b/${f}.npy"
                    RESULT_VARIABLE same)
    if(NOT same EQUAL 0)
      message(FATAL_ERROR "${f}.npy differs between the generated and the reloaded run")
    endif()
    message("${f}.npy identical")
  endif()
endforeach()
