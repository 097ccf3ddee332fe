# The endpoint directory (lib/directory): its stored-value codec (fuzz target and corpus replay),
# and the whole module against a real etcd (the Debian etcd-server package) started by the test.
set(ORB_DIRECTORY_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
orb_fuzz_target(fuzz_dir_entry HARNESS ${ORB_DIRECTORY_TEST_DIR}/fuzz_dir_entry.c
                                       ${PROJECT_SOURCE_DIR}/lib/directory/entry.c
                CORPUS ${ORB_DIRECTORY_TEST_DIR}/entry_corpus OBJECTS orb_base
                FUZZ_OBJECTS orb_base LIBS PkgConfig::JANSSON)

add_executable(test_directory ${ORB_DIRECTORY_TEST_DIR}/test_directory.c)
target_include_directories(test_directory PRIVATE ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_directory PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads)
if(TARGET example_cluster_directory)
  add_test(NAME test_directory COMMAND test_directory $<TARGET_FILE:example_cluster_directory>)
else()
  add_test(NAME test_directory COMMAND test_directory)
endif()
set_tests_properties(test_directory PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
