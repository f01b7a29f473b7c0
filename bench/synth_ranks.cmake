# bench/synth_ranks.cmake - synth_ranks: synthetic per-rank traces of a
# data-parallel job (issue #14.7), written through the public writer API,
# for the cross-rank post-mortem's bench (bench/postmortem*). Run
#   build/bench/synth_ranks --ranks 1024 --steps 1000 --layers 30 --out DIR
# The ctest smoke run writes 6 ranks x 40 steps x 4 layers in both modes and
# verifies them (rank attributes, first non-finite step per rank, digests,
# scales and skipped steps equal across ranks).
add_executable(synth_ranks ${CMAKE_CURRENT_LIST_DIR}/synth_ranks.c)
target_link_libraries(synth_ranks PRIVATE ampprobe_static m)
if(AMPPROBE_BUILD_TESTS)
  foreach(mode scalars full)
    add_test(NAME bench.synth_ranks.${mode}
             COMMAND synth_ranks --ranks 6 --steps 40 --layers 4 --mode ${mode}
                     --fault-rank 4 --fault-step 20 --lead 3 --jobs 2
                     --overwrite --verify
                     --out ${CMAKE_CURRENT_BINARY_DIR}/synth-smoke-${mode})
    set_tests_properties(bench.synth_ranks.${mode} PROPERTIES
                         LABELS "bench;probe" TIMEOUT 120)
  endforeach()
endif()
