# bench/stats.cmake - bench_stats: fused statistics kernel vs naive multi-pass
# vs read bandwidth (bench/stats.c). Not a test; `make bench` runs it.
add_executable(bench_stats ${CMAKE_CURRENT_LIST_DIR}/stats.c)
target_include_directories(bench_stats PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_link_libraries(bench_stats PRIVATE ampprobe_static Threads::Threads m)
# bench_stats_bound: what bounds the fused kernel on fp16 data on one core
# (the double sums alone, timed; bench/stats_bound.c).
add_executable(bench_stats_bound ${CMAKE_CURRENT_LIST_DIR}/stats_bound.c)
target_link_libraries(bench_stats_bound PRIVATE ampprobe_static m)
