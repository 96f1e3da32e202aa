# cli_save.cmake — ctest helper: --save under mpiexec writes the same files as one rank.
# One rank saves A (inputs and outputs); the job saves B from the same flags; the inputs
# must be bitwise identical and the outputs equal within RTOL (bitwise where EXACT names
# them); then the job loads A and saves C, which must equal B bitwise (each rank read its
# shard of A's full arrays).
#   cmake -DATTNRUN=exe -DCOMPARE=exe -DLAUNCH="mpiexec|-n|4|..." -DWORK=dir -DARGS="a|b"
#         [-DGRID="--tp|2"] -DINPUTS="q.npy|k.npy" -DOUTPUTS="o.npy|lse.npy"
#         [-DEXACT="o.npy,lse.npy"] [-DRTOL=1e-5] [-DLOAD_ARGS="a|b"] -P cli_save.cmake
# ARGS go to both runs, GRID only to the job's.
string(REPLACE "|" ";" launch "${LAUNCH}")
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" grid "${GRID}")
string(REPLACE "|" ";" load_args "${LOAD_ARGS}")
string(REPLACE "|" ";" inputs "${INPUTS}")
string(REPLACE "|" ";" outputs "${OUTPUTS}")
string(REPLACE ";" "," inputs_csv "${inputs}")
string(REPLACE ";" "," outputs_csv "${outputs}")
if(NOT RTOL)
  set(RTOL 1e-5)
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 120)
  message("---- ${what}: ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed with exit code ${rc}")
  endif()
endfunction()

run_step("one rank saves A" "${ATTNRUN}" ${args} --save "${WORK}/a")
run_step("the job saves B" ${launch} "${ATTNRUN}" ${grid} ${args} --save "${WORK}/b")
run_step("A and B agree" "${COMPARE}" "${WORK}/a" "${WORK}/b" --rtol ${RTOL}
         --exact "${inputs_csv},${EXACT}" ${inputs} ${outputs})
run_step("the job loads A, saves C" ${launch} "${ATTNRUN}" ${load_args} --load "${WORK}/a"
         --save "${WORK}/c")
run_step("B and C are the same bytes" "${COMPARE}" "${WORK}/b" "${WORK}/c" --rtol 0
         --exact "${inputs_csv},${outputs_csv}" ${inputs} ${outputs})
