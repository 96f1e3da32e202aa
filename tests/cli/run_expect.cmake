# run_expect.cmake — ctest helper for the CLI: runs one command and checks its exit code
# and that stdout / stderr match regular expressions.
#   cmake -DCMD="prog|arg|arg" -DEXPECT_RC=N [-DSTDOUT_REGEX=re] [-DSTDERR_REGEX=re]
#         [-DPREP_FILE=path -DPREP_CONTENT=text] -P run_expect.cmake
string(REPLACE "|" ";" cmd "${CMD}")
if(PREP_FILE)
  file(WRITE "${PREP_FILE}" "${PREP_CONTENT}")
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("---- command: ${cmd}\n---- exit ${rc}\n---- stdout:\n${out}---- stderr:\n${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}")
endif()
if(DEFINED STDOUT_REGEX AND NOT out MATCHES "${STDOUT_REGEX}")
  message(FATAL_ERROR "stdout does not match '${STDOUT_REGEX}'")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${STDERR_REGEX}'")
endif()
