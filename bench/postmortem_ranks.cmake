# bench/postmortem_ranks.cmake - bench_postmortem_ranks: `ampprobe postmortem
# DIR` over 64 / 256 / 1,024 synthetic rank traces (bench/synth_ranks) of
# 1,000 steps x 30 layers: wall time, CPU time, peak RSS
# (bench/postmortem_ranks.c). Run
#   build/bench/bench_postmortem_ranks --md bench/results/postmortem_ranks.md
if(TARGET ampprobe_exe AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/synth_ranks.c)
  add_executable(bench_postmortem_ranks ${CMAKE_CURRENT_LIST_DIR}/postmortem_ranks.c)
  target_compile_definitions(bench_postmortem_ranks PRIVATE
                             AMPPROBE_BIN="$<TARGET_FILE:ampprobe_exe>"
                             SYNTH_BIN="$<TARGET_FILE:synth_ranks>")
  add_dependencies(bench_postmortem_ranks ampprobe_exe synth_ranks)
endif()
