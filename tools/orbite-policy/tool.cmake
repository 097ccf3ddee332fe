# orbite-policy: the administrator's checks of the helper policy (check, explain). It links the
# policy parser and the sysfs discovery directly: liborbite itself never reads policy.
set(ORB_POLICY_TOOL_DIR ${CMAKE_CURRENT_LIST_DIR})
if(NOT TARGET PkgConfig::INIH)
  pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
endif()
add_executable(orbite-policy ${ORB_POLICY_TOOL_DIR}/main.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_policy> $<TARGET_OBJECTS:orb_topo>)
target_include_directories(orbite-policy PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(orbite-policy PRIVATE PkgConfig::INIH PkgConfig::JANSSON Threads::Threads)
install(TARGETS orbite-policy RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})
