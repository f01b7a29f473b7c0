# cmake/AmpprobeLibrary.cmake - what every part of libampprobe shares.
#
# libampprobe is assembled (libprobe/CMakeLists.txt) from object libraries:
# ampprobe_kernels (kernels/), ampprobe_probe (libprobe/) and, when present,
# ampprobe_analysis (libprobe/analysis/). Each part calls
# ampprobe_library_part(<target>) so that all of them are compiled the same
# way: position-independent (they go into the shared library and into a
# static one a plugin or a Python extension may link), with hidden
# visibility (only declarations marked AMPPROBE_API, include/ampprobe/export.h,
# are exported from libampprobe.so), and with the public headers - the source
# tree's include/ and the generated include/ampprobe/version.h - on the path.

include(GNUInstallDirs)

# The generated public header: one version, from project(VERSION).
set(AMPPROBE_GENERATED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
configure_file(${PROJECT_SOURCE_DIR}/include/ampprobe/version.h.in
               ${AMPPROBE_GENERATED_INCLUDE_DIR}/ampprobe/version.h @ONLY)

# The installed (public) headers: the library's API and nothing else.
# include/ampprobe/trainer.h, layers.h and report.h are internal headers of
# the reference trainer, the layer kernels and the report library: they stay
# in include/ampprobe/ for the in-tree parts but are not installed, and their
# functions are not exported (docs/architecture.md).
set(AMPPROBE_PUBLIC_HEADERS
  ${PROJECT_SOURCE_DIR}/include/ampprobe/export.h
  ${PROJECT_SOURCE_DIR}/include/ampprobe/status.h
  ${PROJECT_SOURCE_DIR}/include/ampprobe/numerics.h
  ${PROJECT_SOURCE_DIR}/include/ampprobe/probe.h
  ${AMPPROBE_GENERATED_INCLUDE_DIR}/ampprobe/version.h)
if(EXISTS ${PROJECT_SOURCE_DIR}/include/ampprobe/analysis.h)
  list(APPEND AMPPROBE_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/ampprobe/analysis.h)
endif()

function(ampprobe_library_part target)
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${AMPPROBE_GENERATED_INCLUDE_DIR}>)
endfunction()
