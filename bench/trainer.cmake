# bench/trainer.cmake - bench_trainer: steps/s of the CPU trainer with tracing
# off, flight recorder and full trace, interleaved (bench/trainer.c). Run
#   build/bench/bench_trainer --md bench/results/trainer.md
if(TARGET ampprobe_trainer)
  add_executable(bench_trainer ${CMAKE_CURRENT_LIST_DIR}/trainer.c)
  target_link_libraries(bench_trainer PRIVATE ampprobe_trainer)
  # --calls: the trainer's per-step calls of libprobe reach bench/trainer.c's
  # timing wrappers first (GNU ld / lld --wrap; other linkers: no --calls).
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_compile_definitions(bench_trainer PRIVATE AMPPROBE_BENCH_WRAP=1)
    target_link_options(bench_trainer PRIVATE
      "LINKER:--wrap=probe_step_begin,--wrap=probe_tensor_record"
      "LINKER:--wrap=probe_step_set_scalars,--wrap=probe_scaler_transition"
      "LINKER:--wrap=probe_step_end")
    if(AMPPROBE_BUILD_TESTS)
      # Smoke: the wrappers see the trainer's calls (a full trace's
      # probe_tensor_record time a step is at least 1 us), and a bad
      # argument is an error. Not a timing check: any speed passes.
      add_test(NAME bench.trainer.calls
               COMMAND bench_trainer --reps 1 --steps 20 --calls)
      set_tests_properties(bench.trainer.calls PROPERTIES
        LABELS "bench;trainer" TIMEOUT 120
        PASS_REGULAR_EXPRESSION "\\| full per-layer trace \\| [0-9.]+ \\| [1-9][0-9]*\\.[0-9] \\|")
      add_test(NAME bench.trainer.bad_arg COMMAND bench_trainer --calls --bogus)
      set_tests_properties(bench.trainer.bad_arg PROPERTIES
        LABELS "bench;trainer" TIMEOUT 30 WILL_FAIL TRUE)
    endif()
  endif()
endif()
