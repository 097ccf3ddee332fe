# The CPU stand-in for libcuda.so.1 (tests only, never installed): each flavour is a file named
# libcuda.so.1 in a folder of its own, which tests load by that path.
set(ORB_FAKECUDA_DIR ${CMAKE_CURRENT_LIST_DIR})
foreach(flavour full omit_dtod no_device no_vmm)
  add_library(orb_fakecuda_${flavour} SHARED ${ORB_FAKECUDA_DIR}/fakecuda.c)
  set_target_properties(orb_fakecuda_${flavour} PROPERTIES OUTPUT_NAME cuda PREFIX lib SUFFIX .so.1
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fakecuda/${flavour})
  target_include_directories(orb_fakecuda_${flavour} PRIVATE ${PROJECT_SOURCE_DIR}/lib ${ORB_FAKECUDA_DIR})
  target_link_libraries(orb_fakecuda_${flavour} PRIVATE Threads::Threads)
endforeach()
target_compile_definitions(orb_fakecuda_omit_dtod PRIVATE FAKECUDA_OMIT_DTOD)
target_compile_definitions(orb_fakecuda_no_device PRIVATE FAKECUDA_NO_DEVICE)
target_compile_definitions(orb_fakecuda_no_vmm PRIVATE FAKECUDA_OMIT_VMM)
