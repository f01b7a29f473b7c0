# bench/postmortem.cmake - bench_postmortem: `ampprobe postmortem` on
# generated traces of 2,500 / 10,000 / 20,000 steps x 30 layers x 6 sites:
# time and peak RSS (bench/postmortem.c). Run
#   build/bench/bench_postmortem --md bench/results/postmortem.md
if(TARGET ampprobe_exe)
  add_executable(bench_postmortem ${CMAKE_CURRENT_LIST_DIR}/postmortem.c)
  target_link_libraries(bench_postmortem PRIVATE ampprobe_static m)
  target_compile_definitions(bench_postmortem PRIVATE AMPPROBE_BIN="$<TARGET_FILE:ampprobe_exe>")
  add_dependencies(bench_postmortem ampprobe_exe)
endif()
