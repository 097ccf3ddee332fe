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

# Corpus replay in ctest; libFuzzer target:
# ./fuzz_policy -max_len=8192 -dict=tests/policy/policy.dict tests/policy/corpus
file(GLOB ORB_POLICY_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/common/policy*.c)
orb_fuzz_target(fuzz_policy HARNESS ${ORB_POLICY_TEST_DIR}/fuzz_policy.c
                CORPUS ${ORB_POLICY_TEST_DIR}/corpus OBJECTS orb_base orb_policy
                FUZZ_SOURCES ${ORB_POLICY_FUZZ_SOURCES} FUZZ_OBJECTS orb_base LIBS PkgConfig::INIH)

# orbite-policy check / explain on fixture directories, output compared with expected text.
if(TARGET orbite-policy)
  add_test(NAME test_policy_tool
           COMMAND sh ${ORB_POLICY_TEST_DIR}/test_policy_tool.sh $<TARGET_FILE:orbite-policy>
                   ${ORB_POLICY_TEST_DIR}/tool ${PROJECT_SOURCE_DIR}/tests/data/sysfs/dgx8
                   ${PROJECT_SOURCE_DIR}/policy)
  set_tests_properties(test_policy_tool PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
