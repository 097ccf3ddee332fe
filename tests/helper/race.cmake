# Root only: the installed orbite-helper, with its file capabilities, in a private test system
# (sysns.c) against a hostile tenant racing it for shared slot objects (exits 77 otherwise).
orb_unit_test(test_helper_race SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_race.c ${ORB_HELPER_TEST_UTIL}
              ${ORB_HELPER_TEST_DIR}/sysns.c ${ORB_TEST_FDIO} OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
add_dependencies(test_helper_race orbite-helper)
set_tests_properties(test_helper_race PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)
target_compile_definitions(test_helper_race PRIVATE FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs"
                           ORB_HELPER_EXE="$<TARGET_FILE:orbite-helper>"
                           ORB_HELPER_TEST_EXE="$<TARGET_FILE:orbite-helper-test>")
target_include_directories(test_helper_race PRIVATE ${PROJECT_SOURCE_DIR})
