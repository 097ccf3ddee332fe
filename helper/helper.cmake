# orbite-helper (installed) and orbite-helper-test (the same program with fixture-directory
# options and two test-only requests; never installed).
#
# Both run under a seccomp allow-list, and sanitizer runtimes make system calls of their own:
# so both are always compiled without sanitizers, from the sources of the modules they use
# (the object libraries of a sanitizer build carry instrumented code). The helper's logic is
# still unit-tested under the sanitizers in-process, through orb_helper_core.
pkg_check_modules(LIBCAP REQUIRED IMPORTED_TARGET libcap)
pkg_check_modules(LIBSECCOMP REQUIRED IMPORTED_TARGET libseccomp)
if(NOT TARGET PkgConfig::INIH) # imported targets are visible only in the directory that made them
  pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
endif()

set(ORB_HELPER_DIR ${CMAKE_CURRENT_LIST_DIR})
set(ORB_HELPER_LOGIC_SOURCES ${ORB_HELPER_DIR}/handlers.c ${ORB_HELPER_DIR}/slots.c ${ORB_HELPER_DIR}/monitor.c
    ${ORB_HELPER_DIR}/devx.c ${ORB_HELPER_DIR}/uctx.c
    ${ORB_HELPER_DIR}/sandbox.c)
set(ORB_HELPER_INCLUDES ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib)
set(ORB_HELPER_LIBS PkgConfig::LIBCAP PkgConfig::LIBSECCOMP PkgConfig::INIH PkgConfig::JANSSON
    Threads::Threads)

# Every source of the object libraries the helper links, as absolute paths.
set(ORB_HELPER_DEP_SOURCES)
foreach(lib orb_base orb_wire orb_hproto orb_policy orb_topo)
  get_target_property(srcs ${lib} SOURCES)
  get_target_property(dir ${lib} SOURCE_DIR)
  foreach(s ${srcs})
    if(NOT IS_ABSOLUTE ${s})
      set(s ${dir}/${s})
    endif()
    list(APPEND ORB_HELPER_DEP_SOURCES ${s})
  endforeach()
endforeach()

# Remove the sanitizer flags a target inherited from the top-level directory.
function(orb_helper_unsanitize target)
  foreach(prop COMPILE_OPTIONS LINK_OPTIONS)
    get_target_property(opts ${target} ${prop})
    if(opts)
      list(FILTER opts EXCLUDE REGEX "^-f(no-)?sanitize")
      set_property(TARGET ${target} PROPERTY ${prop} ${opts})
    endif()
  endforeach()
endfunction()

# The modules and the helper logic, uninstrumented; a static archive so that each executable
# pulls only the objects it uses.
add_library(orb_helper_runtime STATIC ${ORB_HELPER_DEP_SOURCES} ${ORB_HELPER_LOGIC_SOURCES})
target_include_directories(orb_helper_runtime PUBLIC ${ORB_HELPER_INCLUDES})
target_link_libraries(orb_helper_runtime PUBLIC ${ORB_HELPER_LIBS})
orb_helper_unsanitize(orb_helper_runtime)

function(orb_helper_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE orb_helper_runtime)
  # Every symbol bound at start-up: no lazy binding once the filter is loaded.
  target_link_options(${name} PRIVATE -Wl,-z,now -Wl,-z,relro)
  orb_helper_unsanitize(${name})
endfunction()

orb_helper_executable(orbite-helper ${ORB_HELPER_DIR}/main.c)
orb_helper_executable(orbite-helper-test ${ORB_HELPER_DIR}/main.c ${ORB_HELPER_DIR}/testing.c)
target_compile_definitions(orbite-helper-test PRIVATE ORB_HELPER_TESTING)

# The helper's logic, instrumented like the rest of the build, for in-process unit tests.
if(ORBITE_BUILD_TESTS)
  add_library(orb_helper_core OBJECT ${ORB_HELPER_LOGIC_SOURCES})
  target_include_directories(orb_helper_core PUBLIC ${ORB_HELPER_INCLUDES})
  target_link_libraries(orb_helper_core PUBLIC PkgConfig::LIBCAP PkgConfig::LIBSECCOMP)
endif()

# Installation: <libexecdir>/orbite/orbite-helper, the path liborbite runs (ORBITE_HELPER_PATH).
# File capabilities do not survive DESTDIR or fakeroot installs; packages set them in a
# post-install step (docs/operations.md). Developers installing as root on the target host can
# let the install step do it.
option(ORBITE_SETCAP_ON_INSTALL "Run setcap on the installed orbite-helper (needs root)" OFF)
set(ORB_HELPER_INSTALL_DIR ${CMAKE_INSTALL_LIBEXECDIR}/orbite)
install(TARGETS orbite-helper RUNTIME DESTINATION ${ORB_HELPER_INSTALL_DIR} COMPONENT orbite_helper
        PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
if(ORBITE_SETCAP_ON_INSTALL)
  find_program(ORB_SETCAP setcap PATHS /usr/sbin /sbin REQUIRED)
  if(IS_ABSOLUTE ${ORB_HELPER_INSTALL_DIR})
    set(ORB_HELPER_INSTALLED "${ORB_HELPER_INSTALL_DIR}/orbite-helper")
  else()
    set(ORB_HELPER_INSTALLED "\${CMAKE_INSTALL_PREFIX}/${ORB_HELPER_INSTALL_DIR}/orbite-helper")
  endif()
  install(CODE "
    set(helper \"\$ENV{DESTDIR}${ORB_HELPER_INSTALLED}\")
    message(STATUS \"setcap cap_chown,cap_dac_override=p \${helper}\")
    execute_process(COMMAND \"${ORB_SETCAP}\" cap_chown,cap_dac_override=p \"\${helper}\"
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR \"setcap on \${helper} failed (\${rc}): run the install as root, without DESTDIR\")
    endif()" COMPONENT orbite_helper)
endif()
