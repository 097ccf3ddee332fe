# The command-line tools beyond orbite-bench (tests/bench): orbite-info on the sysfs fixtures,
# and on real verbs devices in the soft-RoCE VM.
if(ORBITE_BUILD_TOOLS AND TARGET orbite-info)
  find_program(ORB_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT ORB_PYTHON3)
    find_program(ORB_PYTHON3 python3)
  endif()
  if(ORB_PYTHON3)
    add_test(NAME tool_orbite_info
             COMMAND ${ORB_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/check_orbite_info.py $<TARGET_FILE:orbite-info>
                     ${PROJECT_SOURCE_DIR}/tests/data/sysfs)
    set_tests_properties(tool_orbite_info PROPERTIES TIMEOUT 120)
    add_test(NAME tool_orbite_info_device
             COMMAND ${ORB_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/check_orbite_info.py $<TARGET_FILE:orbite-info>
                     ${PROJECT_SOURCE_DIR}/tests/data/sysfs --device)
    set_tests_properties(tool_orbite_info_device PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS rdma-device
                         RESOURCE_LOCK rdma-vm-cpu) # tests/rdma/tests.cmake says why
  endif()
endif()
