# bench/deflate.cmake - bench_deflate: the writer's chunk encoder
# (libprobe/deflate.c) against zlib and libdeflate on the chunks of a real
# trace (bench/deflate.c). Needs zlib; libdeflate when found.
find_package(ZLIB)
if(ZLIB_FOUND)
  find_path(AMPPROBE_LIBDEFLATE_INCLUDE libdeflate.h)
  find_library(AMPPROBE_LIBDEFLATE_LIB deflate)
  add_executable(bench_deflate ${CMAKE_CURRENT_LIST_DIR}/deflate.c
                 ${PROJECT_SOURCE_DIR}/libprobe/deflate.c)
  target_include_directories(bench_deflate PRIVATE ${PROJECT_SOURCE_DIR}/libprobe)
  target_link_libraries(bench_deflate PRIVATE ampprobe_static ZLIB::ZLIB)
  if(AMPPROBE_LIBDEFLATE_INCLUDE AND AMPPROBE_LIBDEFLATE_LIB)
    target_include_directories(bench_deflate PRIVATE ${AMPPROBE_LIBDEFLATE_INCLUDE})
    target_link_libraries(bench_deflate PRIVATE ${AMPPROBE_LIBDEFLATE_LIB})
    target_compile_definitions(bench_deflate PRIVATE AMPPROBE_HAVE_LIBDEFLATE=1)
  endif()
endif()
