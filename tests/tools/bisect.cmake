# tests/tools/bisect.cmake - tests of `ampprobe bisect` and `ampprobe diff`:
# the ddmin core (pure, synthetic oracles), the diff analysis on traces
# written with the libprobe writer, and end-to-end runs of the command over
# the scenario zoo. Included from tests/tools/CMakeLists.txt.
add_executable(test_ddmin ${CMAKE_CURRENT_LIST_DIR}/test_ddmin.c)
target_link_libraries(test_ddmin PRIVATE ampprobe_static PkgConfig::CHECK m)
add_test(NAME tools.ddmin COMMAND test_ddmin)
set_tests_properties(tools.ddmin PROPERTIES LABELS "tools;bisect")

add_executable(test_diff ${CMAKE_CURRENT_LIST_DIR}/test_diff.c)
target_link_libraries(test_diff PRIVATE ampprobe_static PkgConfig::CHECK
                                        PkgConfig::JANSSON m)
add_test(NAME tools.diff COMMAND test_diff)
set_tests_properties(tools.diff PROPERTIES LABELS "tools;diff")

# End-to-end: the real binary over the scenario zoo (trainings with -j 2;
# a few seconds each group).
add_test(NAME tools.e2e.bisect.zoo
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_bisect.sh $<TARGET_FILE:ampprobe_exe> zoo)
add_test(NAME tools.e2e.bisect.errors
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_bisect.sh $<TARGET_FILE:ampprobe_exe> errors)
# fair trials (issue 15.4), external commands (13.5), files and processes
# (17.3/5/6, 15.6); run's output rules and progress lines (e2e_run.sh)
# --resume after Ctrl-C or a finished bisect (resume); --precision bf16
foreach(group fair external safety resume bf16)
  add_test(NAME tools.e2e.bisect.${group}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_bisect.sh $<TARGET_FILE:ampprobe_exe> ${group})
  set_tests_properties(tools.e2e.bisect.${group} PROPERTIES LABELS "tools;e2e" TIMEOUT 300)
endforeach()
# multi-rank trials (issue 14): 2 ranks under mpirun (skipped without it)
add_test(NAME tools.e2e.bisect.ranks
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_bisect.sh $<TARGET_FILE:ampprobe_exe> ranks)
set_tests_properties(tools.e2e.bisect.ranks PROPERTIES LABELS "tools;e2e;mpi"
                     TIMEOUT 300 SKIP_RETURN_CODE 77)
add_test(NAME tools.e2e.run.files
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_run.sh $<TARGET_FILE:ampprobe_exe>)
set_tests_properties(tools.e2e.run.files PROPERTIES LABELS "tools;e2e" TIMEOUT 300)
add_test(NAME tools.e2e.diff
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e_diff.sh $<TARGET_FILE:ampprobe_exe>)
set_tests_properties(tools.e2e.bisect.zoo tools.e2e.bisect.errors tools.e2e.diff
                     PROPERTIES LABELS "tools;e2e" TIMEOUT 300)
if(AMPPROBE_SANITIZE)
  set_tests_properties(tools.e2e.diff PROPERTIES ENVIRONMENT "AMPPROBE_SANITIZE=1")
endif()
