# cmake/AmpprobeInstall.cmake - what `cmake --install` (make install) puts in
# place under the prefix:
#   lib/libampprobe.so.0.3.0 (+ .so.0.3, .so links), lib/libampprobe.a
#   include/ampprobe/{export,status,numerics,probe,version[,analysis]}.h
#   lib/cmake/ampprobe/ampprobeConfig.cmake, ...ConfigVersion.cmake,
#     ampprobeTargets*.cmake: find_package(ampprobe) gives ampprobe::ampprobe
#     (shared) and ampprobe::ampprobe_static
#   lib/pkgconfig/ampprobe.pc (pkg-config ampprobe [--static])
#   bin/ampprobe (when the tools are built)
# Both package files are relocatable: they find the prefix from where they lie.
include(CMakePackageConfigHelpers)

set(AMPPROBE_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ampprobe)
set(AMPPROBE_PKGCONFIGDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS ampprobe ampprobe_static EXPORT ampprobeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${AMPPROBE_PUBLIC_HEADERS}
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ampprobe)
if(TARGET ampprobe_exe)
  install(TARGETS ampprobe_exe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# ---- CMake package ---------------------------------------------------------------
install(EXPORT ampprobeTargets NAMESPACE ampprobe::
        DESTINATION ${AMPPROBE_CMAKEDIR})
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/ampprobeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ampprobeConfig.cmake
  INSTALL_DESTINATION ${AMPPROBE_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ampprobeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ampprobeConfig.cmake
              ${PROJECT_BINARY_DIR}/ampprobeConfigVersion.cmake
        DESTINATION ${AMPPROBE_CMAKEDIR})

# ---- pkg-config --------------------------------------------------------------------
# The static library's needs: HDF5 through its own .pc when there is one
# (Debian: hdf5.pc), else its library files; threads, libm; the CUDA runtime
# (through NVIDIA's cudart-X.Y.pc when pkg-config finds it), CUPTI and the
# C++ runtime in CUDA builds. Library files become -L/-l flags: a .pc names
# libraries as flags for the consumer's linker (AmpprobePkgConfig.cmake).
set(AMPPROBE_PC_REQUIRES_PRIVATE "")
set(AMPPROBE_PC_LIBS_PRIVATE "")
set(_pc_dirs "")
set(_pc_libs "")
include(${PROJECT_SOURCE_DIR}/cmake/AmpprobePkgConfig.cmake)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(AMPPROBE_PC_HDF5 QUIET hdf5)
endif()
if(AMPPROBE_PC_HDF5_FOUND)
  list(APPEND AMPPROBE_PC_REQUIRES_PRIVATE "hdf5")
else()
  ampprobe_pc_libs(_pc_dirs _pc_libs ${HDF5_C_LIBRARIES})
endif()
if(AMPPROBE_HAVE_CUDA)
  set(_cudart_pc cudart-${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR})
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(AMPPROBE_PC_CUDART QUIET ${_cudart_pc})
  endif()
  if(AMPPROBE_PC_CUDART_FOUND)
    list(APPEND AMPPROBE_PC_REQUIRES_PRIVATE ${_cudart_pc})
    set(_cuda_targets CUDA::cupti)
  else()
    set(_cuda_targets CUDA::cudart CUDA::cupti)
  endif()
  foreach(t ${_cuda_targets})
    get_target_property(loc ${t} IMPORTED_LOCATION)
    if(loc)
      ampprobe_pc_libs(_pc_dirs _pc_libs "${loc}")
    endif()
  endforeach()
  list(APPEND _pc_libs -lstdc++)
endif()
list(JOIN _pc_dirs " " _pc_dirs)
list(JOIN _pc_libs " " _pc_libs)
list(JOIN AMPPROBE_PC_REQUIRES_PRIVATE ", " AMPPROBE_PC_REQUIRES_PRIVATE)
set(AMPPROBE_PC_LIBS_PRIVATE "${_pc_dirs} ${_pc_libs}")
string(APPEND AMPPROBE_PC_LIBS_PRIVATE " -pthread -lm")
string(STRIP "${AMPPROBE_PC_LIBS_PRIVATE}" AMPPROBE_PC_LIBS_PRIVATE)
# prefix relative to the .pc file, so the installed tree can be moved.
file(RELATIVE_PATH AMPPROBE_PC_TO_PREFIX /p/${AMPPROBE_PKGCONFIGDIR} /p)
string(REGEX REPLACE "/$" "" AMPPROBE_PC_TO_PREFIX "${AMPPROBE_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ampprobe.pc.in
               ${PROJECT_BINARY_DIR}/ampprobe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ampprobe.pc DESTINATION ${AMPPROBE_PKGCONFIGDIR})
