# The library's side of orbite-helper (lib/helper/), against a fake helper that speaks the
# protocol through the real codec, well or badly; and the rule that a TCP-only engine never
# starts the helper.
add_executable(orb_fake_helper ${CMAKE_CURRENT_LIST_DIR}/fake_helper.c $<TARGET_OBJECTS:orb_hproto>
               $<TARGET_OBJECTS:orb_wire> $<TARGET_OBJECTS:orb_base>)
target_include_directories(orb_fake_helper PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(orb_fake_helper PRIVATE Threads::Threads)

orb_unit_test(test_helper_client SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_helper_client.c
              OBJECTS orb_base orb_wire orb_hproto orb_helperlib)
target_include_directories(test_helper_client PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(test_helper_client PRIVATE
                           FAKE_HELPER_PATH="$<TARGET_FILE:orb_fake_helper>"
                           EXPECTED_HELPER_PATH="${ORBITE_HELPER_PATH}")
add_dependencies(test_helper_client orb_fake_helper)

orb_unit_test(test_helper_engine SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_helper_engine.c
              LIBS orbite_static)
target_include_directories(test_helper_engine PRIVATE ${PROJECT_SOURCE_DIR})

# End to end against the real helper's test build (fixture sysfs, policy and /dev/shm
# directories), when helper/ defines it.
if(TARGET orbite-helper-test)
  orb_unit_test(test_helper_e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_helper_e2e.c
                OBJECTS orb_base orb_wire orb_hproto orb_helperlib orb_topo)
  target_include_directories(test_helper_e2e PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(test_helper_e2e PRIVATE
                             HELPER_TEST_PATH="$<TARGET_FILE:orbite-helper-test>"
                             FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs")
  add_dependencies(test_helper_e2e orbite-helper-test)
endif()
