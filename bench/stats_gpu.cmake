# bench/stats_gpu.cmake - the CUDA statistics benchmark (bench/stats_gpu.cu),
# built only with CUDA. Run build/bench/bench_stats_gpu on a machine with a
# GPU; elsewhere it prints SKIP.
if(AMPPROBE_HAVE_CUDA)
  add_executable(bench_stats_gpu ${CMAKE_CURRENT_LIST_DIR}/stats_gpu.cu)
  target_link_libraries(bench_stats_gpu PRIVATE ampprobe_static CUDA::cudart)
endif()
