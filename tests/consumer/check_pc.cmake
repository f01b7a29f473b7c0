# check_pc.cmake - ampprobe.pc names libraries by flags, not by the build
# host's paths (the library audit's F13: a CUDA build's Libs.private held
# /usr/local/cuda/lib/libcudart.so ...).
#   cmake -DMODULE=<cmake/AmpprobePkgConfig.cmake> [-DPC_FILE=<ampprobe.pc>]
#         -P check_pc.cmake
# The conversion (ampprobe_pc_libs) on the inputs a CUDA build and an HDF5
# without hdf5.pc give it; then, with PC_FILE, the generated file: no
# absolute path to a library file in Libs.private.
cmake_minimum_required(VERSION 3.25)
include(${MODULE})

set(dirs "")
set(libs "")
ampprobe_pc_libs(dirs libs
  /usr/local/cuda/lib/libcudart.so
  /usr/local/cuda/lib/libcupti.so.13
  /usr/lib/x86_64-linux-gnu/hdf5/serial/libhdf5.a
  /usr/lib/x86_64-linux-gnu/libz.so.1.3.1
  dl -pthread)
set(want_dirs "-L/usr/local/cuda/lib;-L/usr/lib/x86_64-linux-gnu/hdf5/serial;-L/usr/lib/x86_64-linux-gnu")
set(want_libs "-lcudart;-lcupti;-lhdf5;-lz;-ldl;-pthread")
if(NOT dirs STREQUAL want_dirs OR NOT libs STREQUAL want_libs)
  message(FATAL_ERROR "check_pc: ampprobe_pc_libs gave\n  ${dirs}\n  ${libs}\n"
                      "expected\n  ${want_dirs}\n  ${want_libs}")
endif()

if(PC_FILE)
  file(STRINGS ${PC_FILE} lines REGEX "^Libs.private:")
  if(lines MATCHES "(^|[ :])/[^ ]*\\.(so|a)([ .]|$)")
    message(FATAL_ERROR "check_pc: ${PC_FILE} names a library by its path: ${lines}")
  endif()
  message(STATUS "check_pc: ${lines}")
endif()
