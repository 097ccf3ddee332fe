# Administrator policy: parser and decisions, directory and file checks, the fuzz target over
# the committed corpus, and the orbite-policy command on fixture directories.
set(ORB_POLICY_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
if(NOT TARGET PkgConfig::INIH)
  pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
endif()

orb_unit_test(test_policy SOURCES ${ORB_POLICY_TEST_DIR}/test_policy.c
              OBJECTS orb_base orb_policy orb_topo LIBS PkgConfig::INIH)
target_compile_definitions(test_policy PRIVATE FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs"
                           EXAMPLES_DIR="${PROJECT_SOURCE_DIR}/policy")
orb_unit_test(test_policy_dir SOURCES ${ORB_POLICY_TEST_DIR}/test_policy_dir.c
              OBJECTS orb_base orb_policy LIBS PkgConfig::INIH)

# The fuzz target linked with the plain main that replays tests/policy/corpus/ (every compiler).
add_executable(fuzz_policy_replay ${ORB_POLICY_TEST_DIR}/fuzz_policy.c
               ${PROJECT_SOURCE_DIR}/tests/wire/fuzz_replay_main.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_policy>)
target_include_directories(fuzz_policy_replay PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(fuzz_policy_replay PRIVATE PkgConfig::INIH Threads::Threads)
add_test(NAME fuzz_policy_replay COMMAND fuzz_policy_replay ${ORB_POLICY_TEST_DIR}/corpus)
set_tests_properties(fuzz_policy_replay PROPERTIES TIMEOUT 120)

# libFuzzer target (not run by ctest): ./fuzz_policy -max_len=8192 -dict=tests/policy/policy.dict
# tests/policy/corpus. The policy sources are compiled into it so that their coverage guides it.
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
    file(GLOB ORB_POLICY_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/common/policy*.c)
    add_executable(fuzz_policy ${ORB_POLICY_TEST_DIR}/fuzz_policy.c ${ORB_POLICY_FUZZ_SOURCES}
                   $<TARGET_OBJECTS:orb_base>)
    target_include_directories(fuzz_policy PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                               ${PROJECT_SOURCE_DIR}/lib)
    target_compile_options(fuzz_policy PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_policy PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_policy PRIVATE PkgConfig::INIH Threads::Threads)
  endif()
endif()

# orbite-policy check / explain on fixture directories, output compared with expected text.
if(TARGET orbite-policy)
  add_test(NAME test_policy_tool
           COMMAND sh ${ORB_POLICY_TEST_DIR}/test_policy_tool.sh $<TARGET_FILE:orbite-policy>
                   ${ORB_POLICY_TEST_DIR}/tool ${PROJECT_SOURCE_DIR}/tests/data/sysfs/dgx8
                   ${PROJECT_SOURCE_DIR}/policy)
  set_tests_properties(test_policy_tool PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
