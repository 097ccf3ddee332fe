# orbite-info: what an engine on this host would see (NICs, GPUs and tiers, the matrix in force,
# the policy through the helper, GPUDirect prerequisites, rankings). It uses the discovery and
# selection modules and the helper client of the static library directly; it opens no NIC.
set(ORB_INFO_TOOL_DIR ${CMAKE_CURRENT_LIST_DIR})
add_executable(orbite-info ${ORB_INFO_TOOL_DIR}/main.c)
target_include_directories(orbite-info PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(orbite-info PRIVATE orbite_static PkgConfig::JANSSON)
install(TARGETS orbite-info RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
