# TENT priority matrices and location strings: unit and property tests, corpus replay of the
# fuzz target, and (clang only) the libFuzzer target itself.
set(ORB_TOPO_MATRIX_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_topo_location SOURCES ${ORB_TOPO_MATRIX_TEST_DIR}/test_location.c
              OBJECTS orb_base orb_topo)
orb_unit_test(test_topo_matrix SOURCES ${ORB_TOPO_MATRIX_TEST_DIR}/test_matrix.c
              OBJECTS orb_base orb_topo)

# The fuzz target linked with the wire tests' replay main, replaying tests/topo_matrix/corpus/
# (valid-* documents compile, bad-* are refused; inputs the fuzzer finds are added as crash-*).
add_executable(fuzz_matrix_replay ${ORB_TOPO_MATRIX_TEST_DIR}/fuzz_matrix.c
               ${PROJECT_SOURCE_DIR}/tests/wire/fuzz_replay_main.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_topo>)
target_include_directories(fuzz_matrix_replay PRIVATE ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(fuzz_matrix_replay PRIVATE PkgConfig::JANSSON Threads::Threads)
add_test(NAME fuzz_matrix_replay COMMAND fuzz_matrix_replay ${ORB_TOPO_MATRIX_TEST_DIR}/corpus)
set_tests_properties(fuzz_matrix_replay PROPERTIES TIMEOUT 120)

# libFuzzer target (not run by ctest): ./fuzz_matrix -max_len=8192 tests/topo_matrix/corpus
# Only the matrix and location sources are compiled into it, so that coverage guides the fuzzer
# through them; ORB_HAVE_LIBFUZZER comes from tests/wire/tests.cmake or is probed here.
if(CMAKE_C_COMPILER_ID STREQUAL "Clang" AND NOT ORBITE_SANITIZE STREQUAL "thread")
  if(NOT DEFINED ORB_HAVE_LIBFUZZER)
    include(CheckCSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
    set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
    check_c_source_compiles("
      #include <stddef.h>
      #include <stdint.h>
      int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
      int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }"
      ORB_HAVE_LIBFUZZER)
    unset(CMAKE_REQUIRED_FLAGS)
    unset(CMAKE_REQUIRED_LINK_OPTIONS)
  endif()
  if(ORB_HAVE_LIBFUZZER)
    add_executable(fuzz_matrix ${ORB_TOPO_MATRIX_TEST_DIR}/fuzz_matrix.c
                   ${PROJECT_SOURCE_DIR}/lib/topo/matrix.c ${PROJECT_SOURCE_DIR}/lib/topo/location.c
                   $<TARGET_OBJECTS:orb_base>)
    target_include_directories(fuzz_matrix PRIVATE ${PROJECT_SOURCE_DIR}/include
                               ${PROJECT_SOURCE_DIR}/lib)
    target_compile_options(fuzz_matrix PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_matrix PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_matrix PRIVATE PkgConfig::JANSSON Threads::Threads)
  endif()
endif()
