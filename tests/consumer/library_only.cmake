# library_only.cmake - the library alone configures and builds with every
# optional part off, and without looking for what only those parts need:
# pkg-config (Check, jansson) and BLAS are disabled for CMake here, so any
# attempt to find them fails the configure. Then it installs.
#
#   cmake -DSOURCE_DIR=<repo> -DWORK=<dir> -DGENERATOR=<gen> -DCC=<cc>
#         -P library_only.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "library_only: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()
run(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/build -G ${GENERATOR}
    -DCMAKE_C_COMPILER=${CC} -DAMPPROBE_CUDA=OFF -DAMPPROBE_WERROR=ON
    -DAMPPROBE_BUILD_TRAINER=OFF -DAMPPROBE_BUILD_TOOLS=OFF
    -DAMPPROBE_BUILD_TESTS=OFF -DAMPPROBE_BUILD_BENCH=OFF
    -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON)
run(build ${CMAKE_COMMAND} --build ${WORK}/build)
run(install ${CMAKE_COMMAND} --install ${WORK}/build --prefix ${WORK}/prefix)
file(GLOB libs ${WORK}/prefix/lib*/libampprobe.so.${AMPPROBE_SOVERSION} ${WORK}/prefix/lib*/libampprobe.a)
list(LENGTH libs n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "library_only: installed libraries: ${libs}")
endif()
if(EXISTS ${WORK}/prefix/bin/ampprobe)
  message(FATAL_ERROR "library_only: the CLI was installed with AMPPROBE_BUILD_TOOLS=OFF")
endif()
message(STATUS "library_only: OK")
