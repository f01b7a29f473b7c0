# tests/consumer/tests.cmake (included from tests/CMakeLists.txt): the
# library as a product.
#
# package.exports   libampprobe.so exports exactly the functions declared in
#                   the installed headers, and those headers compile as
#                   C++11/14/17 (check_exports.cmake; GCC only).
if(CMAKE_C_COMPILER_ID STREQUAL "GNU" AND CMAKE_NM)
  add_test(NAME package.exports
    COMMAND ${CMAKE_COMMAND} -DCC=${CMAKE_C_COMPILER} -DNM=${CMAKE_NM}
            -DCXX=${CMAKE_CXX_COMPILER}
            -DLIB=$<TARGET_FILE:ampprobe>
            "-DHEADERS=${AMPPROBE_PUBLIC_HEADERS}"
            "-DINCLUDES=${PROJECT_SOURCE_DIR}/include;${AMPPROBE_GENERATED_INCLUDE_DIR}"
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/package_exports
            -P ${CMAKE_CURRENT_LIST_DIR}/check_exports.cmake)
  set_tests_properties(package.exports PROPERTIES LABELS "package" TIMEOUT 60)
endif()

# package.consumer  cmake --install into a fresh prefix, then the outside
#                   program tests/consumer/consumer.c built with find_package
#                   and with pkg-config, against the shared and the static
#                   library; each runs, and its trace passes the installed
#                   `ampprobe postmortem` (run_consumer.cmake).
# Not in sanitizer builds: a program built without -fsanitize cannot link the
# instrumented libampprobe.a, nor load the instrumented .so first.
find_program(AMPPROBE_PKG_CONFIG NAMES pkg-config pkgconf)
if(AMPPROBE_PKG_CONFIG AND CMAKE_NM AND NOT AMPPROBE_SANITIZE)
  set(_with_cli OFF)
  if(TARGET ampprobe_exe)
    set(_with_cli ON)
  endif()
  add_test(NAME package.consumer
    COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR}
            -DSOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/package_consumer
            -DCC=${CMAKE_C_COMPILER} -DNM=${CMAKE_NM}
            "-DGENERATOR=${CMAKE_GENERATOR}" -DPKG_CONFIG=${AMPPROBE_PKG_CONFIG}
            -DWITH_CLI=${_with_cli} -DAMPPROBE_SOVERSION=${AMPPROBE_SOVERSION}
            -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
  set_tests_properties(package.consumer PROPERTIES LABELS "package" TIMEOUT 600)
endif()

# package.pc_libs  ampprobe.pc names libraries by -L/-l flags, never by the
#                   build host's paths (check_pc.cmake).
add_test(NAME package.pc_libs
  COMMAND ${CMAKE_COMMAND} -DMODULE=${PROJECT_SOURCE_DIR}/cmake/AmpprobePkgConfig.cmake
          -DPC_FILE=${PROJECT_BINARY_DIR}/ampprobe.pc
          -P ${CMAKE_CURRENT_LIST_DIR}/check_pc.cmake)
set_tests_properties(package.pc_libs PROPERTIES LABELS "package" TIMEOUT 60)

# package.library_only  the library alone (every AMPPROBE_BUILD_* off, CUDA
#                   off to stay quick) configures without pkg-config and BLAS,
#                   builds with -Werror and installs (library_only.cmake).
add_test(NAME package.library_only
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DWORK=${CMAKE_CURRENT_BINARY_DIR}/package_library_only
          "-DGENERATOR=${CMAKE_GENERATOR}" -DCC=${CMAKE_C_COMPILER}
          -DAMPPROBE_SOVERSION=${AMPPROBE_SOVERSION}
          -P ${CMAKE_CURRENT_LIST_DIR}/library_only.cmake)
set_tests_properties(package.library_only PROPERTIES LABELS "package" TIMEOUT 600)
