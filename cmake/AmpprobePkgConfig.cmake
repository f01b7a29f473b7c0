# cmake/AmpprobePkgConfig.cmake - libraries as ampprobe.pc names them.
#
# ampprobe_pc_libs(<dirs_var> <libs_var> <lib>...) appends each lib to two
# lists: a library file /d/lib<name>.so[.N...] or .a as -L/d (to dirs_var,
# once) and -l<name> (to libs_var); a flag (-pthread, -lfoo) as it is; a bare
# name as -l<name>. A .pc file names libraries by flags for the consumer's
# linker: an absolute path is the build host's (/usr/local/cuda/lib/
# libcudart.so), which `pkg-config --static` would pass through as is.
# Used by AmpprobeInstall.cmake; checked by tests/consumer/check_pc.cmake.
function(ampprobe_pc_libs dirs_var libs_var)
  set(dirs ${${dirs_var}})
  set(libs ${${libs_var}})
  foreach(l ${ARGN})
    if(l MATCHES "^-")
      list(APPEND libs "${l}")
    elseif(IS_ABSOLUTE "${l}")
      get_filename_component(dir "${l}" DIRECTORY)
      get_filename_component(name "${l}" NAME)
      if(name MATCHES "^lib(.+)\\.(so|a|dylib)(\\.[0-9.]+)?$")
        list(APPEND dirs "-L${dir}")
        list(APPEND libs "-l${CMAKE_MATCH_1}")
      else()
        list(APPEND libs "${l}") # no lib<name>.so/.a: only its path names it
      endif()
    elseif(NOT l STREQUAL "")
      list(APPEND libs "-l${l}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(${dirs_var} ${dirs} PARENT_SCOPE)
  set(${libs_var} ${libs} PARENT_SCOPE)
endfunction()
