# Two-process tests through the public API of the shared library.
add_executable(test_two_process ${CMAKE_CURRENT_LIST_DIR}/test_two_process.c
               ${CMAKE_CURRENT_LIST_DIR}/source_proc.c ${ORB_TEST_FDIO})
target_include_directories(test_two_process PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_two_process PRIVATE orbite PkgConfig::CMOCKA)
if(ORBITE_SANITIZE STREQUAL "thread")
  target_compile_definitions(test_two_process PRIVATE ORB_TEST_TSAN=1)
endif()
add_test(NAME test_two_process COMMAND test_two_process)
set_tests_properties(test_two_process PROPERTIES TIMEOUT 600)
# The same suite on the same-host transport.
add_test(NAME test_two_process_shm COMMAND test_two_process --transport shm)
set_tests_properties(test_two_process_shm PROPERTIES TIMEOUT 600)
