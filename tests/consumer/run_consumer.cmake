# run_consumer.cmake - install the build into a fresh prefix and build the
# outside program tests/consumer/consumer.c against it four ways:
#   find_package + ampprobe::ampprobe         (shared)
#   find_package + ampprobe::ampprobe_static  (static)
#   pkg-config ampprobe                       (shared)
#   pkg-config --static ampprobe              (static: -l:libampprobe.a)
# Then a CUDA build's package (its config edited on a copy of the prefix)
# for a consumer without a CUDA toolkit: found, shared only.
# Each one must link the kind it asked for (nm: probe_session_open undefined
# in the program / defined in it), run, write a trace, read it back (and run
# the post-mortem in-process when <ampprobe/analysis.h> is installed); then
# the installed `ampprobe postmortem` must diagnose the trace healthy (exit 0).
#
#   cmake -DBUILD_DIR=<build> -DSOURCE_DIR=<tests/consumer> -DWORK=<dir>
#         -DCC=<C compiler> -DNM=<nm> -DGENERATOR=<generator>
#         [-DPKG_CONFIG=<pkg-config>] [-DWITH_CLI=ON] -P run_consumer.cmake
cmake_minimum_required(VERSION 3.25)
foreach(v BUILD_DIR SOURCE_DIR WORK CC NM GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_consumer: -D${v}=... missing")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run_consumer: ${what} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(prefix ${WORK}/prefix)

# ---- install, and what it installed --------------------------------------------
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
file(GLOB_RECURSE installed RELATIVE ${prefix} ${prefix}/*)
list(SORT installed)
string(REPLACE ";" "\n  " listing "${installed}")
message(STATUS "installed into ${prefix}:\n  ${listing}")
set(libdir "")
foreach(f ${installed})
  if(f MATCHES "^(.*)/libampprobe\\.a$")
    set(libdir ${CMAKE_MATCH_1})
  endif()
endforeach()
if(NOT libdir)
  message(FATAL_ERROR "run_consumer: no libampprobe.a installed")
endif()
set(expect ${libdir}/libampprobe.so ${libdir}/libampprobe.so.${AMPPROBE_SOVERSION} ${libdir}/pkgconfig/ampprobe.pc
    ${libdir}/cmake/ampprobe/ampprobeConfig.cmake
    ${libdir}/cmake/ampprobe/ampprobeConfigVersion.cmake
    ${libdir}/cmake/ampprobe/ampprobeTargets.cmake
    include/ampprobe/export.h include/ampprobe/status.h include/ampprobe/numerics.h
    include/ampprobe/probe.h include/ampprobe/version.h)
if(WITH_CLI)
  list(APPEND expect bin/ampprobe)
endif()
foreach(f ${expect})
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "run_consumer: ${f} not installed")
  endif()
endforeach()
# internal headers stay internal
foreach(f trainer.h layers.h report.h)
  if(EXISTS ${prefix}/include/ampprobe/${f})
    message(FATAL_ERROR "run_consumer: internal header ${f} was installed")
  endif()
endforeach()
if(WITH_CLI)
  run("ampprobe --version" ${prefix}/bin/ampprobe --version)
  file(STRINGS ${prefix}/include/ampprobe/version.h vline REGEX "define AMPPROBE_VERSION_STRING")
  string(REGEX MATCH "\"([^\"]*)\"" _ "${vline}")
  if(NOT last_out STREQUAL "ampprobe ${CMAKE_MATCH_1}\n")
    message(FATAL_ERROR "run_consumer: `ampprobe --version` says '${last_out}', version.h ${CMAKE_MATCH_1}")
  endif()
endif()

# ---- the four builds -----------------------------------------------------------
function(check_and_run name kind)
  set(exe ${WORK}/${name}/consumer)
  run("nm ${name}" ${NM} ${exe})
  if(kind STREQUAL "shared")
    set(want "U probe_session_open\n")
  else()
    set(want "T probe_session_open\n")
  endif()
  string(FIND "${last_out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "run_consumer: ${name} is not linked ${kind} (nm has no '${want}')")
  endif()
  set(trace ${WORK}/${name}.h5)
  run("consumer ${name}" ${exe} ${trace})
  message(STATUS "${name}: ${last_out}")
  if(WITH_CLI)
    execute_process(COMMAND ${prefix}/bin/ampprobe postmortem ${trace}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "run_consumer: `ampprobe postmortem ${trace}` exited ${rc} "
                          "(0 = healthy expected):\n${out}\n${err}")
    endif()
  endif()
endfunction()

foreach(kind shared static)
  if(kind STREQUAL "static")
    set(static ON)
  else()
    set(static OFF)
  endif()
  run("configure find_package ${kind}" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/cmake-${kind}
      -G ${GENERATOR} -DCMAKE_C_COMPILER=${CC} -DCMAKE_PREFIX_PATH=${prefix}
      -DCONSUMER_STATIC=${static})
  run("build find_package ${kind}" ${CMAKE_COMMAND} --build ${WORK}/cmake-${kind})
  check_and_run(cmake-${kind} ${kind})
endforeach()

if(PKG_CONFIG)
  set(pcenv ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/${libdir}/pkgconfig)
  foreach(kind shared static)
    if(kind STREQUAL "static")
      run("pkg-config --static" ${pcenv} ${PKG_CONFIG} --static --cflags --libs ampprobe)
      # both kinds lie in libdir; ask for the archive by name
      string(REPLACE "-lampprobe" "-l:libampprobe.a" flags "${last_out}")
    else()
      run("pkg-config" ${pcenv} ${PKG_CONFIG} --cflags --libs ampprobe)
      set(flags "${last_out} -Wl,-rpath,${prefix}/${libdir}")
    endif()
    separate_arguments(flags UNIX_COMMAND "${flags}")
    file(MAKE_DIRECTORY ${WORK}/pkgconfig-${kind})
    run("cc pkg-config ${kind}" ${CC} -std=c11 -o ${WORK}/pkgconfig-${kind}/consumer
        ${SOURCE_DIR}/consumer.c ${flags})
    check_and_run(pkgconfig-${kind} ${kind})
  endforeach()
else()
  message(FATAL_ERROR "run_consumer: no pkg-config (-DPKG_CONFIG=...): the pkg-config builds cannot run")
endif()
# ---- a CUDA build's package, for a consumer without a CUDA toolkit ------------
# The installed config of a CUDA build (ampprobe_HAVE_CUDA ON), on a copy of
# this prefix, with the consumer's find_package(CUDAToolkit) disabled: the
# shared library is still found and linked (find_dependency(CUDAToolkit)
# failed the whole find_package before), and asking for the component
# "static", which needs the CUDA runtime, fails the find.
set(cprefix ${WORK}/prefix-cuda)
file(COPY ${prefix}/ DESTINATION ${cprefix})
set(cfg_file ${cprefix}/${libdir}/cmake/ampprobe/ampprobeConfig.cmake)
file(READ ${cfg_file} cfg)
string(REGEX REPLACE "set\\(ampprobe_HAVE_CUDA [A-Za-z0-9]*\\)"
       "set(ampprobe_HAVE_CUDA ON)" cfg_cuda "${cfg}")
if(NOT cfg_cuda MATCHES "set\\(ampprobe_HAVE_CUDA ON\\)")
  message(FATAL_ERROR "run_consumer: no set(ampprobe_HAVE_CUDA ...) in ${cfg_file}")
endif()
file(WRITE ${cfg_file} "${cfg_cuda}")
run("configure find_package shared, CUDA build, no CUDA toolkit"
    ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/cmake-nocuda -G ${GENERATOR}
    -DCMAKE_C_COMPILER=${CC} -DCMAKE_PREFIX_PATH=${cprefix}
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE -DCONSUMER_STATIC=OFF)
run("build find_package shared, CUDA build, no CUDA toolkit"
    ${CMAKE_COMMAND} --build ${WORK}/cmake-nocuda)
# the component, where it is there: a CPU build's static library
run("configure find_package COMPONENTS static" ${CMAKE_COMMAND} -S ${SOURCE_DIR}
    -B ${WORK}/cmake-static-component -G ${GENERATOR} -DCMAKE_C_COMPILER=${CC}
    -DCMAKE_PREFIX_PATH=${prefix} -DCONSUMER_STATIC=ON -DCONSUMER_COMPONENTS=static)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/cmake-nocuda-static
                -G ${GENERATOR} -DCMAKE_C_COMPILER=${CC} -DCMAKE_PREFIX_PATH=${cprefix}
                -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE -DCONSUMER_STATIC=ON
                -DCONSUMER_COMPONENTS=static
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "run_consumer: find_package(ampprobe COMPONENTS static) of a "
                      "CUDA build succeeded without a CUDA toolkit")
endif()
message(STATUS "run_consumer: a CUDA build's package without CUDA: shared OK, static refused")

message(STATUS "run_consumer: OK")
