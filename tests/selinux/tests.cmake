# The SELinux module (selinux/) compiles with the reference policy's development Makefile;
# skipped (77) where the selinux-policy-dev toolchain is not installed.
add_test(NAME selinux_module
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/compile_module.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(selinux_module PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
