# cli_expect.cmake — ctest helper for attnrun under mpiexec: runs one job and checks its
# exit code (a number, or "nonzero"), that stdout / stderr match regular expressions, that
# it ended within MAX_S seconds, that no process of it is left (ORPHANS: a pgrep -f
# pattern), and optionally that the last line of a --json file has the listed keys.
# Lists use '|' instead of ';'.
#   cmake -DLAUNCH="mpiexec|-n|3|--oversubscribe" -DEXE=attnrun -DARGS="a|b" -DEXPECT_RC=0
#         [-DSTDOUT_REGEX=re] [-DSTDERR_REGEX=re] [-DMAX_S=60] [-DORPHANS=pattern]
#         [-DJSON_FILE=f -DJSON_KEYS="k1|k2"] [-DENV_VARS="A=1|B=2"] -P cli_expect.cmake
string(REPLACE "|" ";" launch "${LAUNCH}")
string(REPLACE "|" ";" args "${ARGS}")
if(NOT MAX_S)
  set(MAX_S 60)
endif()
# mpiexec forwards the listed variables to every rank (-x), whatever the launcher.
set(env_flags "")
if(ENV_VARS)
  string(REPLACE "|" ";" env_list "${ENV_VARS}")
  foreach(kv ${env_list})
    string(REGEX REPLACE "=.*" "" var "${kv}")
    string(REGEX REPLACE "^[^=]*=" "" val "${kv}")
    set(ENV{${var}} "${val}")
    list(APPEND env_flags -x ${var})
  endforeach()
endif()
if(JSON_FILE)
  file(REMOVE "${JSON_FILE}")
endif()

string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${launch} ${env_flags} ${EXE} ${args} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${MAX_S})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("---- ${launch} ${env_flags} ${EXE} ${args}\n---- exit '${rc}' after ${elapsed} s\n"
        "---- stdout:\n${out}---- stderr:\n${err}---- end")

set(failures "")
if(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$")
    list(APPEND failures "exit '${rc}', expected a non-zero exit code")
  endif()
elseif(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  list(APPEND failures "exit '${rc}', expected ${EXPECT_RC}")
endif()
if(elapsed GREATER MAX_S)
  list(APPEND failures "took ${elapsed} s, more than ${MAX_S} s")
endif()
if(DEFINED STDOUT_REGEX AND NOT out MATCHES "${STDOUT_REGEX}")
  list(APPEND failures "stdout does not match '${STDOUT_REGEX}'")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  list(APPEND failures "stderr does not match '${STDERR_REGEX}'")
endif()

# Nothing of the job may survive it (a killed or stalled rank's peers included).
if(ORPHANS)
  foreach(try RANGE 5)
    execute_process(COMMAND pgrep -f "${ORPHANS}" OUTPUT_VARIABLE pids RESULT_VARIABLE none)
    if(NOT none EQUAL 0)
      break()
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1)
  endforeach()
  if(none EQUAL 0)
    string(REPLACE "\n" " " pids "${pids}")
    list(APPEND failures "processes left behind: ${pids}")
  endif()
endif()

if(JSON_FILE)
  file(STRINGS "${JSON_FILE}" lines)
  list(POP_BACK lines rec)
  string(REPLACE "|" ";" keys "${JSON_KEYS}")
  foreach(key ${keys})
    string(REPLACE "." ";" path "${key}")
    string(JSON v ERROR_VARIABLE e GET "${rec}" ${path})
    if(e)
      list(APPEND failures "JSON key '${key}': ${e}")
    endif()
  endforeach()
endif()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "FAILED:\n  ${failures}")
endif()
