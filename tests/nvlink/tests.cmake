# The NVLink (CUDA IPC) transport's control messages: their codec, and a fuzz harness replaying
# its corpus.
orb_unit_test(test_nvlink_msg SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_nvlink_msg.c OBJECTS orb_base orb_wire orb_nvlink_msg)
orb_fuzz_target(fuzz_nvlink_msg HARNESS ${CMAKE_CURRENT_LIST_DIR}/fuzz_nvlink_msg.c
                CORPUS ${CMAKE_CURRENT_LIST_DIR}/corpus
                OBJECTS orb_base orb_wire orb_nvlink_msg
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/nvlink/nvlink_msg.c
                FUZZ_OBJECTS orb_base orb_wire)

# The transport through whole engines on the full stand-in: one process and two.
add_executable(test_nvlink ${CMAKE_CURRENT_LIST_DIR}/test_nvlink.c ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
target_include_directories(test_nvlink PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda ${PROJECT_SOURCE_DIR}/tests/engine
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_nvlink PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
                      ${CMAKE_DL_LIBS})
add_dependencies(test_nvlink orb_fakecuda_full)
target_compile_definitions(test_nvlink PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
add_test(NAME test_nvlink COMMAND test_nvlink)
set_tests_properties(test_nvlink PROPERTIES TIMEOUT 300)

# An engine that never uses CUDA: the transport is there, and libcuda.so.1 is never loaded.
add_executable(test_nvlink_cpu_only ${CMAKE_CURRENT_LIST_DIR}/test_nvlink_cpu_only.c
               ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
target_include_directories(test_nvlink_cpu_only PRIVATE ${PROJECT_SOURCE_DIR}/tests/engine ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_nvlink_cpu_only PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
                      ${CMAKE_DL_LIBS})
add_test(NAME test_nvlink_cpu_only COMMAND test_nvlink_cpu_only)
set_tests_properties(test_nvlink_cpu_only PROPERTIES TIMEOUT 120)

# The administrator's policy (the real helper's test build holding it) over the transport.
if(TARGET orbite-helper-test)
  add_executable(test_nvlink_policy ${CMAKE_CURRENT_LIST_DIR}/test_nvlink_policy.c
                 ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
  target_include_directories(test_nvlink_policy PRIVATE ${PROJECT_SOURCE_DIR}/tests/engine ${PROJECT_SOURCE_DIR}/lib
                             ${PROJECT_SOURCE_DIR})
  target_link_libraries(test_nvlink_policy PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON
                        Threads::Threads ${CMAKE_DL_LIBS})
  add_dependencies(test_nvlink_policy orb_fakecuda_full orbite-helper-test)
  target_compile_definitions(test_nvlink_policy PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>"
                             HELPER_TEST_PATH="$<TARGET_FILE:orbite-helper-test>"
                             FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs")
  add_test(NAME test_nvlink_policy COMMAND test_nvlink_policy)
  set_tests_properties(test_nvlink_policy PROPERTIES TIMEOUT 120)
endif()
