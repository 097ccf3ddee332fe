# The libibverbs loader (lib/rdma/verbs.c): stand-in libraries with and without a required
# export, the real library where installed, and the rule that a TCP engine never loads it.
set(ORB_RDMA_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
foreach(flavour full missing optional)
  add_library(orb_fake_verbs_${flavour} SHARED ${ORB_RDMA_TEST_DIR}/fake_verbs.c)
  set_target_properties(orb_fake_verbs_${flavour} PROPERTIES OUTPUT_NAME fake_verbs_${flavour})
endforeach()
target_compile_definitions(orb_fake_verbs_missing PRIVATE FAKE_OMIT_REG_MR_IOVA2)
target_compile_definitions(orb_fake_verbs_optional PRIVATE FAKE_WITH_OPTIONAL)

orb_unit_test(test_rdma_verbs SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_verbs.c OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire
              LIBS ${CMAKE_DL_LIBS})
add_dependencies(test_rdma_verbs orb_fake_verbs_full orb_fake_verbs_missing orb_fake_verbs_optional)
target_compile_definitions(test_rdma_verbs PRIVATE
                           FAKE_VERBS_FULL="$<TARGET_FILE:orb_fake_verbs_full>"
                           FAKE_VERBS_MISSING="$<TARGET_FILE:orb_fake_verbs_missing>"
                           FAKE_VERBS_OPTIONAL="$<TARGET_FILE:orb_fake_verbs_optional>")

# Which NICs an engine opens and how, on a scripted operation table.
orb_unit_test(test_rdma_devices SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_devices.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# Through the public API of the shared library: TCP engines that move bytes never map
# libibverbs (nor libcuda) into the process.
add_executable(test_rdma_not_loaded ${ORB_RDMA_TEST_DIR}/test_rdma_not_loaded.c
               ${PROJECT_SOURCE_DIR}/tests/engine/util.c)
target_include_directories(test_rdma_not_loaded PRIVATE ${PROJECT_SOURCE_DIR}/tests/engine)
target_link_libraries(test_rdma_not_loaded PRIVATE orbite PkgConfig::CMOCKA)
add_test(NAME test_rdma_not_loaded COMMAND test_rdma_not_loaded)
set_tests_properties(test_rdma_not_loaded PROPERTIES TIMEOUT 120)

# On a real verbs device (skipped with 77 without one): the verbs calls the transport is built on.
# ctest runs it here; tests/vm/vm-run.sh runs every test labelled rdma-device on soft-RoCE.
orb_unit_test(test_rdma_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_device.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire orb_topo
              LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device)

# The transport's start-up and registrations in a real engine, on a scripted environment.
orb_unit_test(test_rdma_transport SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_transport.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})

# The same on real verbs devices (skipped with 77 without one; runs in the soft-RoCE VM).
orb_unit_test(test_rdma_engine_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_engine_device.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_engine_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device)

# The queue pair's pure rules: READ depths, signalling, exact WR identity.
orb_unit_test(test_rdma_qp SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_qp.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# The staging arena's extent allocator.
orb_unit_test(test_rdma_extents SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_extents.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# GPUDirect registration routes and the peer-memory probe.
orb_unit_test(test_rdma_gdr SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_gdr.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# What a failed attempt leads to: replay or end, and the remote effect (the whole rule table).
orb_unit_test(test_rdma_outcome SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_outcome.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# Looking at a list in turns: the lanes' and the source reaper's bounded snapshots.
orb_unit_test(test_rdma_turns SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_turns.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# Memory windows and their key history, on a scripted allocator.
orb_unit_test(test_rdma_window SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_window.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# DevX grant keys (gpu_source_reuse) against a device model and the helper's own key check.
orb_unit_test(test_devx_key SOURCES ${ORB_RDMA_TEST_DIR}/test_devx_key.c ${PROJECT_SOURCE_DIR}/helper/devx.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})

# The grant's verbs steps on real devices (the VM's rails topology; 77 elsewhere).
orb_unit_test(test_rdma_grant_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_grant_device.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_grant_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device)

# The RDMA transport's messages: unit test, corpus replay and libFuzzer target (clang):
# ./fuzz_rdma_ctrl tests/rdma/ctrl_corpus
orb_unit_test(test_rdma_ctrl SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_ctrl.c
              OBJECTS orb_base orb_rdma orb_helperlib orb_hproto orb_wire LIBS ${CMAKE_DL_LIBS})
target_compile_definitions(test_rdma_ctrl PRIVATE CTRL_CORPUS_DIR="${ORB_RDMA_TEST_DIR}/ctrl_corpus")
orb_fuzz_target(fuzz_rdma_ctrl HARNESS ${ORB_RDMA_TEST_DIR}/fuzz_rdma_ctrl.c
                CORPUS ${ORB_RDMA_TEST_DIR}/ctrl_corpus
                OBJECTS orb_base orb_wire orb_rdma orb_helperlib orb_hproto LIBS ${CMAKE_DL_LIBS}
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/rdma/ctrl.c ${PROJECT_SOURCE_DIR}/lib/wire/wire.c
                FUZZ_OBJECTS orb_base)

# Requests over RDMA between two engines across the rails topology (77 without it).
orb_unit_test(test_rdma_xfer_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_xfer_device.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_xfer_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device)
# Its device-memory cell runs on the CUDA stand-in.
add_dependencies(test_rdma_xfer_device orb_fakecuda_full)
target_include_directories(test_rdma_xfer_device PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
target_compile_definitions(test_rdma_xfer_device PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
# The same with both sides staging, and with only the source staging (the requester's own
# staging is the "staged" run's; the source-staged run also covers a direct requester against a
# source that answers "not now"). The cells with device memory at both ends run in the direct
# run only: no host memory policy reaches them.
foreach(p staged source-staged)
  add_test(NAME test_rdma_xfer_${p}_device COMMAND test_rdma_xfer_device --policy ${p})
  set_tests_properties(test_rdma_xfer_${p}_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 600)
endforeach()
# And with the lanes sleeping on completion events instead of polling.
add_test(NAME test_rdma_xfer_events_device COMMAND test_rdma_xfer_device --progress event_driven)
set_tests_properties(test_rdma_xfer_events_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 600)
# And with the requester signalling one work request in four.
add_test(NAME test_rdma_xfer_signal_device COMMAND test_rdma_xfer_device --signal-interval 4)
set_tests_properties(test_rdma_xfer_signal_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 600)

# An unprivileged tenant's engine through the helper, on the rails topology (77 without it or
# without root): the policy's one device and budget, AUTO against REQUIRED.
orb_unit_test(test_rdma_helper_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_helper_device.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
target_compile_definitions(test_rdma_helper_device PRIVATE ORB_HELPER_TEST_EXE="$<TARGET_FILE:orbite-helper-test>")
add_dependencies(test_rdma_helper_device orbite-helper-test)
set_tests_properties(test_rdma_helper_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300)

# The budgets at their limits on the rails topology (77 without it): refusals that name them,
# waits that end, and service again once they free.
orb_unit_test(test_rdma_budgets_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_budgets_device.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_budgets_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300)

# Faults on the rails topology, the source in a second process (77 without it or without root):
# ports down and addresses replaced, a killed or frozen source, and the device refusing posts
# and teardown (a test-only interposer over the loaded verbs table, tests/rdma/verbs_interposer.h).
orb_unit_test(test_rdma_faults_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_faults_device.c
                                              ${ORB_RDMA_TEST_DIR}/verbs_interposer.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
set_tests_properties(test_rdma_faults_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300
                     ENVIRONMENT "ORBITE_TEST_SKIP=test_an_unprovable_post_stays_charged")
# Its one cell that mostly waits (a refused READ kept charged through the 30 s destruction
# window) runs on its own, beside the others (below), its engines on completion events: idle
# polling lanes would take a third of a CPU from the test beside it.
add_test(NAME test_rdma_faults_unprovable_device COMMAND test_rdma_faults_device)
set_tests_properties(test_rdma_faults_unprovable_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300
                     ENVIRONMENT "ORBITE_TEST_FILTER=test_an_unprovable_post_stays_charged;ORBITE_TEST_PROGRESS=event_driven")

# Device memory registered with the NICs (cuda_memory direct): the routes, the dma-buf geometry and
# descriptor, no fallback, and the requester's data path through a device double (77 elsewhere).
orb_unit_test(test_rdma_gdr_device SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_gdr_device.c
                                           ${ORB_RDMA_TEST_DIR}/verbs_interposer.c
                                           ${ORB_RDMA_TEST_DIR}/devx_double.c ${PROJECT_SOURCE_DIR}/helper/devx.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
add_dependencies(test_rdma_gdr_device orb_fakecuda_full)
target_include_directories(test_rdma_gdr_device PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
target_compile_definitions(test_rdma_gdr_device PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
set_tests_properties(test_rdma_gdr_device PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300)

# The GPUDirect gate (hardware/gdr-gate.sh runs it on a GPU and real NICs): both directions, 4096
# bytes and the two-rail folded tail, both progress modes, guards on both peers, every payload
# WR inside the device range and the MR's arguments those of the allocation (77 elsewhere).
orb_unit_test(test_rdma_gdr_gate SOURCES ${ORB_RDMA_TEST_DIR}/test_rdma_gdr_gate.c
                                         ${ORB_RDMA_TEST_DIR}/verbs_interposer.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
add_dependencies(test_rdma_gdr_gate orb_fakecuda_full)
target_include_directories(test_rdma_gdr_gate PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakecuda)
target_compile_definitions(test_rdma_gdr_gate PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
set_tests_properties(test_rdma_gdr_gate PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300)
add_test(NAME test_rdma_gdr_gate_events COMMAND test_rdma_gdr_gate --progress event_driven)
set_tests_properties(test_rdma_gdr_gate_events PROPERTIES SKIP_RETURN_CODE 77 LABELS rdma-device TIMEOUT 300)

# The soft-RoCE VM runs the rdma-device tests two at a time (build.sh: ctest -j2), but never two
# that load its two CPUs: those hold rdma-vm-cpu, one after another, and only the faults cell that
# mostly waits runs beside them. It and the rest of the faults test, which takes rails down and
# changes their addresses, hold rdma-vm-links, so they never overlap.
set(ORB_VM_CPU_TESTS test_rdma_device test_rdma_engine_device test_rdma_grant_device test_rdma_xfer_device
    test_rdma_xfer_staged_device test_rdma_xfer_source-staged_device test_rdma_xfer_events_device
    test_rdma_xfer_signal_device test_rdma_helper_device test_rdma_budgets_device test_rdma_faults_device
    test_rdma_gdr_device test_rdma_gdr_gate test_rdma_gdr_gate_events)
set_tests_properties(${ORB_VM_CPU_TESTS} PROPERTIES RESOURCE_LOCK rdma-vm-cpu)
set_property(TEST test_rdma_faults_device APPEND PROPERTY RESOURCE_LOCK rdma-vm-links)
set_tests_properties(test_rdma_faults_unprovable_device PROPERTIES RESOURCE_LOCK rdma-vm-links)
