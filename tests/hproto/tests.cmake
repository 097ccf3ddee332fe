# Helper protocol codec and datagram I/O: unit tests, corpus replay of the fuzz target, and (clang
# only) the libFuzzer target itself.
set(ORB_HPROTO_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_hproto SOURCES ${ORB_HPROTO_TEST_DIR}/test_hproto.c ${ORB_HPROTO_TEST_DIR}/hp_check.c
              OBJECTS orb_base orb_wire orb_hproto)

# The fuzz target linked with the plain main of tests/wire/ that replays tests/hproto/corpus/.
add_executable(fuzz_hproto_replay ${ORB_HPROTO_TEST_DIR}/fuzz_hproto.c ${ORB_HPROTO_TEST_DIR}/hp_check.c
               ${PROJECT_SOURCE_DIR}/tests/wire/fuzz_replay_main.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_wire> $<TARGET_OBJECTS:orb_hproto>)
target_include_directories(fuzz_hproto_replay PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib ${ORB_HPROTO_TEST_DIR})
target_link_libraries(fuzz_hproto_replay PRIVATE Threads::Threads)
add_test(NAME fuzz_hproto_replay COMMAND fuzz_hproto_replay ${ORB_HPROTO_TEST_DIR}/corpus)
set_tests_properties(fuzz_hproto_replay PROPERTIES TIMEOUT 120)

# libFuzzer target (not run by ctest): ./fuzz_hproto -max_len=4200 tests/hproto/corpus
# The codec is compiled into it directly so that its coverage guides the fuzzer. ORB_HAVE_LIBFUZZER
# is the check made by tests/wire/tests.cmake; it is repeated here in case that fragment is absent.
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
    add_executable(fuzz_hproto ${ORB_HPROTO_TEST_DIR}/fuzz_hproto.c ${ORB_HPROTO_TEST_DIR}/hp_check.c
                   ${PROJECT_SOURCE_DIR}/common/helper_proto.c ${PROJECT_SOURCE_DIR}/lib/wire/wire.c
                   $<TARGET_OBJECTS:orb_base>)
    target_include_directories(fuzz_hproto PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                               ${PROJECT_SOURCE_DIR}/lib ${ORB_HPROTO_TEST_DIR})
    target_compile_options(fuzz_hproto PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_hproto PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_hproto PRIVATE Threads::Threads)
  endif()
endif()
