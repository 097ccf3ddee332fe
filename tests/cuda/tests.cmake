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

# Device memory through whole engines over TCP (registration, staging on both sides, failed
# copies, concurrency, close), on the full stand-in as the process's driver. Linked with the
# static library, whose internal test hook picks the stand-in.
add_executable(test_cuda_tcp ${CMAKE_CURRENT_LIST_DIR}/test_cuda_tcp.c ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
target_include_directories(test_cuda_tcp PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda ${PROJECT_SOURCE_DIR}/tests/engine
                           ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_cuda_tcp PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
                      ${CMAKE_DL_LIBS})
add_dependencies(test_cuda_tcp orb_fakecuda_full)
target_compile_definitions(test_cuda_tcp PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
add_test(NAME test_cuda_tcp COMMAND test_cuda_tcp)
set_tests_properties(test_cuda_tcp PROPERTIES TIMEOUT 300)
