# Install rules for liborbite: shared library (with its SONAME links), static library, public
# headers, a pkg-config file and a CMake package exporting orbite::orbite and orbite::orbite_static.
# Included at the end of lib/CMakeLists.txt, where the targets are defined.
#
# Components: orbite_runtime (the shared library itself) and orbite_development (everything needed
# to build against it).
include(CMakePackageConfigHelpers)

set(ORB_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/orbite)
set(ORB_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

set_target_properties(orbite PROPERTIES EXPORT_NAME orbite)
set_target_properties(orbite_static PROPERTIES EXPORT_NAME orbite_static)

install(TARGETS orbite orbite_static EXPORT orbiteTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
                COMPONENT orbite_runtime
                NAMELINK_COMPONENT orbite_development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
                COMPONENT orbite_development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/orbite
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT orbite_development
        FILES_MATCHING PATTERN "*.h")

# pkg-config: with relative install directories the prefix is written relative to the .pc file's
# own directory (${pcfiledir}), so an installed tree can be moved or installed with --prefix.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ORB_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ORB_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(ORB_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  set(ORB_PC_PREFIX "\${pcfiledir}")
  string(REPLACE "/" ";" ORB_PC_DIR_PARTS "${ORB_PKGCONFIG_DIR}")
  foreach(part ${ORB_PC_DIR_PARTS})
    if(NOT part STREQUAL "" AND NOT part STREQUAL ".")
      string(APPEND ORB_PC_PREFIX "/..")
    endif()
  endforeach()
  set(ORB_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ORB_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/orbite.pc.in ${PROJECT_BINARY_DIR}/orbite.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/orbite.pc
        DESTINATION ${ORB_PKGCONFIG_DIR}
        COMPONENT orbite_development)

# CMake package.
install(EXPORT orbiteTargets
        NAMESPACE orbite::
        FILE orbiteTargets.cmake
        DESTINATION ${ORB_CMAKE_PACKAGE_DIR}
        COMPONENT orbite_development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/orbiteConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/orbiteConfig.cmake
                              INSTALL_DESTINATION ${ORB_CMAKE_PACKAGE_DIR})
# 0.x releases may break compatibility between minor versions.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/orbiteConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/orbiteConfig.cmake ${PROJECT_BINARY_DIR}/orbiteConfigVersion.cmake
        DESTINATION ${ORB_CMAKE_PACKAGE_DIR}
        COMPONENT orbite_development)
