# bench/trainer.cmake - bench_trainer: steps/s of the CPU trainer with tracing
# off, flight recorder and full trace, interleaved (bench/trainer.c). Run
#   build/bench/bench_trainer --md bench/results/trainer.md
if(TARGET ampprobe_trainer)
  add_executable(bench_trainer ${CMAKE_CURRENT_LIST_DIR}/trainer.c)
  target_link_libraries(bench_trainer PRIVATE ampprobe_trainer)
endif()
