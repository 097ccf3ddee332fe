# Tests of the library's public face: exported symbols, the header in C and C++, reference
# pages, and the installed package (pkg-config and find_package consumers).
set(ORB_API_DIR ${CMAKE_CURRENT_LIST_DIR})

# (a) The exported symbols are exactly lib/orbite.map and cover every function of the header.
find_program(ORB_NM nm)
if(ORB_NM)
  add_test(NAME api_symbols
           COMMAND sh ${ORB_API_DIR}/check_symbols.sh $<TARGET_FILE:orbite>
                   ${PROJECT_SOURCE_DIR}/lib/orbite.map
                   ${PROJECT_SOURCE_DIR}/include/orbite/orbite.h ${CMAKE_C_COMPILER})
  set_tests_properties(api_symbols PROPERTIES TIMEOUT 60)
endif()

# Every public function has its reference page, and documentation links resolve.
add_test(NAME api_docs COMMAND sh ${ORB_API_DIR}/check_docs.sh ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER})
set_tests_properties(api_docs PROPERTIES TIMEOUT 60)

# The README's code sample builds and runs.
add_test(NAME api_readme_sample
         COMMAND sh ${ORB_API_DIR}/readme_sample.sh ${PROJECT_SOURCE_DIR}/README.md ${CMAKE_C_COMPILER}
                 ${PROJECT_SOURCE_DIR}/include $<TARGET_FILE:orbite>
                 ${CMAKE_CURRENT_BINARY_DIR}/api-readme "${ORBITE_SANITIZE}")
set_tests_properties(api_readme_sample PROPERTIES TIMEOUT 120)

# (c) The header is self-contained C: built with the project's flags and linked, and also
# syntax-checked alone as strict C99 and C11.
add_executable(api_header_c ${ORB_API_DIR}/header_alone.c)
target_link_libraries(api_header_c PRIVATE orbite)
add_test(NAME api_header_c COMMAND api_header_c)
foreach(std c99 c11)
  add_test(NAME api_header_${std}_pedantic
           COMMAND ${CMAKE_C_COMPILER} -std=${std} -pedantic-errors -Wall -Wextra -Werror
                   -Wstrict-prototypes -fsyntax-only -x c
                   ${PROJECT_SOURCE_DIR}/include/orbite/orbite.h)
endforeach()

# (b) The header compiles as C++11 with warnings as errors and links with C linkage. C++ is only
# enabled here, and only when a C++ compiler exists.
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  add_executable(api_header_cxx ${ORB_API_DIR}/header_cxx.cpp)
  # The directory's warning flags include C-only ones; keep the rest (sanitizers too).
  get_target_property(orb_cxx_options api_header_cxx COMPILE_OPTIONS)
  list(REMOVE_ITEM orb_cxx_options -Wmissing-prototypes -Wstrict-prototypes)
  set_target_properties(api_header_cxx PROPERTIES
                        COMPILE_OPTIONS "${orb_cxx_options};-Wall;-Wextra;-Werror;-Wpedantic"
                        CXX_STANDARD 11 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_link_libraries(api_header_cxx PRIVATE orbite)
  add_test(NAME api_header_cxx COMMAND api_header_cxx)
else()
  message(STATUS "No C++ compiler: the C++ header test is skipped")
endif()

# Install into a scratch prefix inside the build tree and build consumers against it.
find_program(ORB_READELF readelf)
if(PKG_CONFIG_EXECUTABLE AND ORB_READELF)
  add_test(NAME api_install
           COMMAND sh ${ORB_API_DIR}/install_consumer.sh ${CMAKE_COMMAND} ${PROJECT_BINARY_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/api-install ${ORB_API_DIR}/consumer
                   ${CMAKE_C_COMPILER} "${CMAKE_GENERATOR}" "${ORBITE_SANITIZE}")
  set_tests_properties(api_install PROPERTIES TIMEOUT 180)
endif()
