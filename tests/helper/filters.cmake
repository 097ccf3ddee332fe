# test_helper_filters: the worker's and the monitor's seccomp filters, each loaded in a forked
# child, and which calls they admit or answer with SIGSYS. Built like orbite-helper itself, from
# the uninstrumented orb_helper_runtime and without sanitizers: a sanitizer runtime makes system
# calls of its own, which the filters would kill.
add_executable(test_helper_filters ${CMAKE_CURRENT_LIST_DIR}/test_helper_filters.c)
target_include_directories(test_helper_filters PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_helper_filters PRIVATE orb_helper_runtime PkgConfig::CMOCKA)
# Every symbol bound at start-up: no lazy binding once a child's filter is loaded.
target_link_options(test_helper_filters PRIVATE -Wl,-z,now -Wl,-z,relro)
orb_helper_unsanitize(test_helper_filters)
add_test(NAME test_helper_filters COMMAND test_helper_filters)
set_tests_properties(test_helper_filters PROPERTIES TIMEOUT 300)
