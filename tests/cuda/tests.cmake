# The libcuda.so.1 loader (lib/cuda/cuda.c) on the fakecuda stand-ins (tests/fakecuda): a whole
# one, one without an export, one whose cuInit finds no device.
orb_unit_test(test_cuda_loader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_loader.c OBJECTS orb_base orb_mem orb_cuda
              LIBS ${CMAKE_DL_LIBS})
target_include_directories(test_cuda_loader PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
add_dependencies(test_cuda_loader orb_fakecuda_full orb_fakecuda_omit_dtod orb_fakecuda_no_device orb_fakecuda_no_vmm)
target_compile_definitions(test_cuda_loader PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>"
                           FAKECUDA_OMIT_DTOD="$<TARGET_FILE:orb_fakecuda_omit_dtod>"
                           FAKECUDA_NO_DEVICE="$<TARGET_FILE:orb_fakecuda_no_device>"
                           FAKECUDA_NO_VMM="$<TARGET_FILE:orb_fakecuda_no_vmm>")

# The CUDA memory owners (lib/cuda/cuda_memory.c) through their public calls, on the full
# stand-in as the process's driver (hardware/gpu-check.sh runs these three on a real driver too).
orb_unit_test(test_cuda_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_memory.c
              OBJECTS orb_base orb_mem orb_cuda LIBS ${CMAKE_DL_LIBS})
target_include_directories(test_cuda_memory PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
add_dependencies(test_cuda_memory orb_fakecuda_full)
target_compile_definitions(test_cuda_memory PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")

# Whole engines on the full stand-in as the process's driver, linked with the static library,
# whose internal test hook picks the stand-in: device memory over TCP (registration, staging on
# both sides, failed copies, concurrency, close), and producer readiness.
foreach(t test_cuda_tcp test_cuda_ready)
  add_executable(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.c ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda ${PROJECT_SOURCE_DIR}/tests/engine
                             ${PROJECT_SOURCE_DIR}/lib)
  target_link_libraries(${t} PRIVATE orbite_static PkgConfig::CMOCKA PkgConfig::JANSSON Threads::Threads
                        ${CMAKE_DL_LIBS})
  add_dependencies(${t} orb_fakecuda_full)
  target_compile_definitions(${t} PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
  add_test(NAME ${t} COMMAND ${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 300)
endforeach()

# The cuda_copy example on the stand-in: the example's own source, linked with the static
# library and the hook that picks the stand-in before main.
add_executable(example_cuda_copy_fake ${PROJECT_SOURCE_DIR}/examples/cuda_copy.c
               ${PROJECT_SOURCE_DIR}/tests/fakecuda/use_fakecuda.c)
target_include_directories(example_cuda_copy_fake PRIVATE ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(example_cuda_copy_fake PRIVATE orbite_static PkgConfig::JANSSON Threads::Threads
                      ${CMAKE_DL_LIBS})
add_dependencies(example_cuda_copy_fake orb_fakecuda_full)
target_compile_definitions(example_cuda_copy_fake PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
add_test(NAME example_cuda_copy_fake COMMAND example_cuda_copy_fake 0 1)
set_tests_properties(example_cuda_copy_fake PROPERTIES TIMEOUT 300)

# The driver's own copy rates, printed by hardware/gpu-check.sh beside OrbiTE's (a tool, not a
# test: it needs a GPU).
add_executable(cuda_rates ${CMAKE_CURRENT_LIST_DIR}/cuda_rates.c $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_mem>
               $<TARGET_OBJECTS:orb_cuda>)
target_include_directories(cuda_rates PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(cuda_rates PRIVATE Threads::Threads ${CMAKE_DL_LIBS})

# What GPUDirect registration would find (hardware/gpu-check.sh's gdr step), and the same program
# on the stand-in in ctest, so that its checks are known to run.
add_executable(gdr_probe ${CMAKE_CURRENT_LIST_DIR}/gdr_probe.c)
target_include_directories(gdr_probe PRIVATE ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(gdr_probe PRIVATE orbite_static Threads::Threads ${CMAKE_DL_LIBS})
add_dependencies(gdr_probe orb_fakecuda_full)
add_test(NAME gdr_probe_fake COMMAND gdr_probe 0 $<TARGET_FILE:orb_fakecuda_full>)
set_tests_properties(gdr_probe_fake PROPERTIES PASS_REGULAR_EXPRESSION "dmabuf=yes exports=2 peermem=0x[0-9a-f]+ route=dma-buf")
