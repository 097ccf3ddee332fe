# orbite-helper: its logic in-process (instrumented like the rest of the build) and the helper
# process itself (never instrumented: it runs under its seccomp filter, which a sanitizer
# runtime's own system calls would trip).
foreach(pkg INIH:inih LIBCAP:libcap LIBSECCOMP:libseccomp) # directory-scoped imported targets
  string(REPLACE ":" ";" pair ${pkg})
  list(GET pair 0 prefix)
  list(GET pair 1 module)
  if(NOT TARGET PkgConfig::${prefix})
    pkg_check_modules(${prefix} REQUIRED IMPORTED_TARGET ${module})
  endif()
endforeach()
set(ORB_HELPER_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
set(ORB_HELPER_TEST_UTIL ${ORB_HELPER_TEST_DIR}/helper_test_util.c)
set(ORB_HELPER_TEST_OBJECTS orb_base orb_wire orb_hproto orb_policy orb_topo orb_helper_core)
set(ORB_HELPER_TEST_LIBS PkgConfig::INIH PkgConfig::LIBCAP PkgConfig::LIBSECCOMP)

# In-process: key-context checks, device context creation, slot objects, request handlers.
orb_unit_test(test_helper_devx SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_devx.c
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
orb_unit_test(test_helper_uctx SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_uctx.c
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
orb_unit_test(test_helper_slots SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_slots.c ${ORB_HELPER_TEST_UTIL}
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
orb_unit_test(test_helper_handlers SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_handlers.c ${ORB_HELPER_TEST_UTIL}
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})

# The processes: the test build under its real filter, the installed build's refusals, and
# (as root) the file-capability installation run as an unprivileged user.
orb_unit_test(test_helper_session SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_session.c ${ORB_HELPER_TEST_UTIL}
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
orb_unit_test(test_helper_caps SOURCES ${ORB_HELPER_TEST_DIR}/test_helper_caps.c ${ORB_HELPER_TEST_UTIL}
              ${ORB_HELPER_TEST_DIR}/sysns.c ${ORB_TEST_FDIO}
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS})
# Hardware check: the real device context and DevX key verification on an mlx5 NIC (exits 77
# without one). libibverbs and libmlx5 are loaded at run time; the library links neither.
orb_unit_test(hw_helper_mlx5_import SOURCES ${ORB_HELPER_TEST_DIR}/hw_mlx5_import.c ${ORB_HELPER_TEST_UTIL}
              ${PROJECT_SOURCE_DIR}/lib/rdma/devx_key.c ${PROJECT_SOURCE_DIR}/lib/rdma/window.c
              OBJECTS ${ORB_HELPER_TEST_OBJECTS} LIBS ${ORB_HELPER_TEST_LIBS} ${CMAKE_DL_LIBS})
add_dependencies(hw_helper_mlx5_import orbite-helper-test)
set_tests_properties(hw_helper_mlx5_import PROPERTIES SKIP_RETURN_CODE 77)
add_dependencies(test_helper_session orbite-helper orbite-helper-test)
add_dependencies(test_helper_caps orbite-helper orbite-helper-test)
set_tests_properties(test_helper_caps PROPERTIES SKIP_RETURN_CODE 77)

foreach(t test_helper_devx test_helper_uctx test_helper_slots test_helper_handlers test_helper_session test_helper_caps
          hw_helper_mlx5_import)
  target_compile_definitions(${t} PRIVATE FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs"
                             ORB_HELPER_EXE="$<TARGET_FILE:orbite-helper>"
                             ORB_HELPER_TEST_EXE="$<TARGET_FILE:orbite-helper-test>")
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR})
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/filters.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/race.cmake)
