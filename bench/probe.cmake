# bench/probe.cmake - bench_probe: libprobe's cost per recorded tensor beyond
# the statistics kernel, records appended per second, bytes per record on
# disk (bench/probe.c). Not a test; `make bench` runs it.
add_executable(bench_probe ${CMAKE_CURRENT_LIST_DIR}/probe.c)
target_link_libraries(bench_probe PRIVATE ampprobe_static)
