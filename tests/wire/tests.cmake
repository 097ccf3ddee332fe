# Wire protocol codec: unit tests, corpus replay of the fuzz target, and (clang only) the
# libFuzzer target itself.
set(ORB_WIRE_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_wire SOURCES ${ORB_WIRE_TEST_DIR}/test_wire.c OBJECTS orb_base orb_wire)

# The fuzz target linked with a plain main that replays tests/wire/corpus/ (every compiler).
add_executable(fuzz_wire_replay ${ORB_WIRE_TEST_DIR}/fuzz_wire.c ${ORB_WIRE_TEST_DIR}/fuzz_replay_main.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_wire>)
target_include_directories(fuzz_wire_replay PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(fuzz_wire_replay PRIVATE Threads::Threads)
add_test(NAME fuzz_wire_replay COMMAND fuzz_wire_replay ${ORB_WIRE_TEST_DIR}/corpus)
set_tests_properties(fuzz_wire_replay PROPERTIES TIMEOUT 120)

# libFuzzer target (not run by ctest): ./fuzz_wire -max_len=4096 tests/wire/corpus
# The codec is compiled into it directly so that its coverage guides the fuzzer.
if(CMAKE_C_COMPILER_ID STREQUAL "Clang" AND NOT ORBITE_SANITIZE STREQUAL "thread")
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
  if(ORB_HAVE_LIBFUZZER)
    add_executable(fuzz_wire ${ORB_WIRE_TEST_DIR}/fuzz_wire.c ${PROJECT_SOURCE_DIR}/lib/wire/wire.c
                   $<TARGET_OBJECTS:orb_base>)
    target_include_directories(fuzz_wire PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib)
    target_compile_options(fuzz_wire PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_wire PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_wire PRIVATE Threads::Threads)
  endif()
endif()
