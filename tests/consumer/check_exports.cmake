# check_exports.cmake - libampprobe.so exports exactly its public API.
#
#   cmake -DCC=<C compiler> -DNM=<nm> -DLIB=<libampprobe.so>
#         -DHEADERS=<public header;...> -DINCLUDES=<dir;...> -DWORK=<dir>
#         [-DCXX=<C++ compiler>] -P check_exports.cmake
#
# With CXX, the same translation unit must also compile as C++11, C++14 and
# C++17 with -Wall -Wextra -pedantic -Werror: the headers say extern "C" and
# are meant for C++ callers (a hexadecimal float literal, C++17 only, broke
# C++11/14 before).
#
# The declarations come from the compiler, not from a list kept by hand:
# one translation unit includes every installed header and GCC's -aux-info
# writes out every function declared in it, with its file. The set of
# non-static functions declared in the public headers must equal the set of
# symbols `nm -D --defined-only` finds in the library:
#   exported but not declared  -> an internal symbol leaks (probe__*, helpers)
#   declared but not exported  -> a public declaration lacks AMPPROBE_API,
#                                 or the function is not in the library
cmake_minimum_required(VERSION 3.25)
foreach(v CC NM LIB HEADERS INCLUDES WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_exports: -D${v}=... missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

# ---- the declarations --------------------------------------------------------
set(tu "")
set(header_names "")
foreach(h ${HEADERS})
  get_filename_component(name ${h} NAME)
  list(APPEND header_names ${name})
  string(APPEND tu "#include \"ampprobe/${name}\"\n")
endforeach()
file(WRITE ${WORK}/all_headers.c "${tu}")
set(incflags "")
foreach(d ${INCLUDES})
  list(APPEND incflags -I${d})
endforeach()
execute_process(
  COMMAND ${CC} -std=c11 -fsyntax-only -aux-info ${WORK}/decls.txt ${incflags}
          ${WORK}/all_headers.c
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_exports: compiling the public headers failed:\n${err}")
endif()
if(CXX)
  file(WRITE ${WORK}/all_headers.cpp "${tu}int main() { return 0; }\n")
  foreach(std c++11 c++14 c++17)
    execute_process(
      COMMAND ${CXX} -std=${std} -Wall -Wextra -pedantic -Werror -fsyntax-only
              ${incflags} ${WORK}/all_headers.cpp
      RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "check_exports: the public headers do not compile as "
                          "${std} (-Wall -Wextra -pedantic -Werror):\n${err}")
    endif()
  endforeach()
  message(STATUS "check_exports: the public headers compile as C++11, C++14 and C++17")
endif()
file(READ ${WORK}/decls.txt decls)
# One line per declaration: /* <file>:<line>:<flags> */ <declaration>;
string(REPLACE ";" "" decls "${decls}")
string(REPLACE "[" "(" decls "${decls}")
string(REPLACE "]" ")" decls "${decls}")
string(REPLACE "\n" ";" decls "${decls}")
set(declared "")
foreach(line ${decls})
  if(NOT line MATCHES "^/\\* ([^:]+):([0-9]+):[A-Za-z]+ \\*/ (.*)$")
    continue()
  endif()
  set(file ${CMAKE_MATCH_1})
  set(decl "${CMAKE_MATCH_3}")
  get_filename_component(fname ${file} NAME)
  get_filename_component(fdir ${file} DIRECTORY)
  get_filename_component(fdir ${fdir} NAME)
  if(NOT fdir STREQUAL "ampprobe" OR NOT fname IN_LIST header_names)
    continue() # system headers
  endif()
  if(decl MATCHES "^static ")
    continue() # static inline helpers are not library symbols
  endif()
  if(NOT decl MATCHES "([A-Za-z_][A-Za-z0-9_]*) \\(")
    message(FATAL_ERROR "check_exports: cannot read a name in: ${decl}")
  endif()
  list(APPEND declared ${CMAKE_MATCH_1})
endforeach()
list(REMOVE_DUPLICATES declared)
list(SORT declared)
list(LENGTH declared n_declared)

# ---- the exports ---------------------------------------------------------------
execute_process(COMMAND ${NM} -D --defined-only ${LIB}
                RESULT_VARIABLE rc OUTPUT_VARIABLE nm_out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_exports: nm -D ${LIB} failed: ${err}")
endif()
string(REPLACE ";" "" nm_out "${nm_out}")
string(REPLACE "\n" ";" nm_out "${nm_out}")
set(exported "")
foreach(line ${nm_out})
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
    set(sym ${CMAKE_MATCH_1})
    # symbols the linker defines in every shared object
    if(sym MATCHES "^(_init|_fini|_edata|_end|__bss_start)$")
      continue()
    endif()
    list(APPEND exported ${sym})
  endif()
endforeach()
list(REMOVE_DUPLICATES exported)
list(SORT exported)
list(LENGTH exported n_exported)

set(leaked ${exported})
list(REMOVE_ITEM leaked ${declared})
set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
message(STATUS "check_exports: ${n_declared} functions declared in ${header_names}; "
               "${n_exported} symbols exported by ${LIB}")
set(failed OFF)
if(n_declared EQUAL 0 OR n_exported EQUAL 0)
  message(SEND_ERROR "check_exports: nothing declared or nothing exported - the check would be empty")
  set(failed ON)
endif()
if(leaked)
  string(REPLACE ";" "\n  " l "${leaked}")
  message(SEND_ERROR "check_exports: exported but not declared in a public header "
                     "(internal symbols: make them static, or give them the probe__ "
                     "prefix without AMPPROBE_API):\n  ${l}")
  set(failed ON)
endif()
if(missing)
  string(REPLACE ";" "\n  " l "${missing}")
  message(SEND_ERROR "check_exports: declared in a public header but not exported "
                     "(missing AMPPROBE_API on the declaration, or not in the library):\n  ${l}")
  set(failed ON)
endif()
if(NOT failed)
  message(STATUS "check_exports: OK, the ${n_exported} exported symbols are exactly the public API")
endif()
