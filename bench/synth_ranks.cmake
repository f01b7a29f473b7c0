# bench/synth_ranks.cmake - synth_ranks: synthetic per-rank traces of a
# data-parallel job (issue #14.7), written through the public writer API,
# for the cross-rank post-mortem's bench (bench/postmortem*). Run
#   build/bench/synth_ranks --ranks 1024 --steps 1000 --layers 30 --out DIR
# The ctest smoke runs write 6 ranks x 40 steps x 4 layers in both modes and
# verify them (rank attributes, first non-finite step per rank, digests,
# scales and skipped steps equal across ranks); three more verify the
# scalars set against a wrong fault rank, lead and world size and must
# fail with a verify message.
add_executable(synth_ranks ${CMAKE_CURRENT_LIST_DIR}/synth_ranks.c)
target_link_libraries(synth_ranks PRIVATE ampprobe_static m)
if(AMPPROBE_BUILD_TESTS)
  set(_synth_job --steps 40 --layers 4 --fault-step 20)
  set(_synth_dir ${CMAKE_CURRENT_BINARY_DIR}/synth-smoke)
  foreach(mode scalars full)
    add_test(NAME bench.synth_ranks.${mode}
             COMMAND synth_ranks --ranks 6 ${_synth_job} --mode ${mode}
                     --fault-rank 4 --lead 3 --jobs 2 --overwrite --verify
                     --out ${_synth_dir}-${mode})
    set_tests_properties(bench.synth_ranks.${mode} PROPERTIES
                         LABELS "bench;probe" TIMEOUT 120
                         FIXTURES_SETUP synth_${mode})
  endforeach()
  foreach(wrong "--ranks;6;--fault-rank;3;--lead;3"
                "--ranks;6;--fault-rank;4;--lead;2"
                "--ranks;7;--fault-rank;4;--lead;3")
    string(REPLACE ";" "" _name "${wrong}")
    string(REPLACE "--" "_" _name "${_name}")
    add_test(NAME bench.synth_ranks.verify_fails${_name}
             COMMAND synth_ranks ${wrong} ${_synth_job} --verify-only
                     --out ${_synth_dir}-scalars)
    set_tests_properties(bench.synth_ranks.verify_fails${_name} PROPERTIES
                         LABELS "bench;probe" TIMEOUT 60
                         PASS_REGULAR_EXPRESSION "synth_ranks: verify: "
                         FIXTURES_REQUIRED synth_scalars)
  endforeach()
endif()
