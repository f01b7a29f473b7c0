# bench/report.cmake - `ampprobe report` on a long trace: bench_report_gen
# writes a synthetic 10,000-step x 30-layer trace through libprobe, and
# bench/report/run.sh times the report, its peak memory and the HTML size
# (results in bench/results/report.md).
if(TARGET ampprobe_static)
  add_executable(bench_report_gen ${CMAKE_CURRENT_LIST_DIR}/report/gen_trace.c)
  target_link_libraries(bench_report_gen PRIVATE ampprobe_static)
endif()
