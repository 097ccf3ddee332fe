# The libcuda.so.1 loader (lib/cuda/cuda.c) on the fakecuda stand-ins (tests/fakecuda): a whole
# one, one without an export, one whose cuInit finds no device.
orb_unit_test(test_cuda_loader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_loader.c OBJECTS orb_base orb_cuda
              LIBS ${CMAKE_DL_LIBS})
target_include_directories(test_cuda_loader PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
add_dependencies(test_cuda_loader orb_fakecuda_full orb_fakecuda_omit_dtod orb_fakecuda_no_device)
target_compile_definitions(test_cuda_loader PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>"
                           FAKECUDA_OMIT_DTOD="$<TARGET_FILE:orb_fakecuda_omit_dtod>"
                           FAKECUDA_NO_DEVICE="$<TARGET_FILE:orb_fakecuda_no_device>")
