# bench/stats.cmake - bench_stats: fused statistics kernel vs naive multi-pass
# vs read bandwidth (bench/stats.c). Not a test; `make bench` runs it.
add_executable(bench_stats ${CMAKE_CURRENT_LIST_DIR}/stats.c)
target_include_directories(bench_stats PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_link_libraries(bench_stats PRIVATE ampprobe_kernels Threads::Threads m)
