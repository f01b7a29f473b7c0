# tests/consumer/tests.cmake (included from tests/CMakeLists.txt): the
# library as a product.
#
# package.exports   libampprobe.so exports exactly the functions declared in
#                   the installed headers (check_exports.cmake; GCC only).
if(CMAKE_C_COMPILER_ID STREQUAL "GNU" AND CMAKE_NM)
  add_test(NAME package.exports
    COMMAND ${CMAKE_COMMAND} -DCC=${CMAKE_C_COMPILER} -DNM=${CMAKE_NM}
            -DLIB=$<TARGET_FILE:ampprobe>
            "-DHEADERS=${AMPPROBE_PUBLIC_HEADERS}"
            "-DINCLUDES=${PROJECT_SOURCE_DIR}/include;${AMPPROBE_GENERATED_INCLUDE_DIR}"
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/package_exports
            -P ${CMAKE_CURRENT_LIST_DIR}/check_exports.cmake)
  set_tests_properties(package.exports PROPERTIES LABELS "package" TIMEOUT 60)
endif()
