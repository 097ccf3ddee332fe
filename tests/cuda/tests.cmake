# The libcuda.so.1 loader (lib/cuda/cuda.c) on the fakecuda stand-ins (tests/fakecuda): a whole
# one, one without an export, one whose cuInit finds no device.
orb_unit_test(test_cuda_loader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_loader.c OBJECTS orb_base orb_mem orb_cuda
              LIBS ${CMAKE_DL_LIBS})
target_include_directories(test_cuda_loader PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
add_dependencies(test_cuda_loader orb_fakecuda_full orb_fakecuda_omit_dtod orb_fakecuda_no_device)
target_compile_definitions(test_cuda_loader PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>"
                           FAKECUDA_OMIT_DTOD="$<TARGET_FILE:orb_fakecuda_omit_dtod>"
                           FAKECUDA_NO_DEVICE="$<TARGET_FILE:orb_fakecuda_no_device>")

# The CUDA memory owners (lib/cuda/cuda_memory.c) through their public calls, on the full
# stand-in as the process's driver.
orb_unit_test(test_cuda_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_memory.c
              OBJECTS orb_base orb_mem orb_cuda LIBS ${CMAKE_DL_LIBS})
target_include_directories(test_cuda_memory PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
add_dependencies(test_cuda_memory orb_fakecuda_full)
target_compile_definitions(test_cuda_memory PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
