# Runs CMD (a shell-style command line) and passes only if it exits non-zero and its output
# matches the regexes EXPECT and (if given) EXPECT2: checks that the SPMD harness reports
# failures instead of hanging.
separate_arguments(cmd UNIX_COMMAND "${CMD}")
# A hang is a failure: the cases must end well within the timeout.
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message("${out}${err}")
if(NOT rc MATCHES "^[0-9]+$" OR rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit code from: ${CMD}; got '${rc}'")
endif()
foreach(re IN ITEMS "${EXPECT}" "${EXPECT2}")
  if(NOT re STREQUAL "" AND NOT "${out}${err}" MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}' (exit code ${rc})")
  endif()
endforeach()
