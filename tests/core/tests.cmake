orb_unit_test(test_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory.c OBJECTS orb_base orb_mem)
orb_unit_test(test_registry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_registry.c OBJECTS orb_base orb_mem)
# What transports remember of a peer's answers about remote ranges.
orb_unit_test(test_range_memo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_range_memo.c
              ${PROJECT_SOURCE_DIR}/lib/core/range_memo.c OBJECTS orb_base)
orb_unit_test(test_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config.c OBJECTS orb_base orb_config)
orb_unit_test(test_error SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_error.c OBJECTS orb_base)
# Native libraries loaded with dlopen: every required symbol or none.
orb_unit_test(test_dynlib SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dynlib.c OBJECTS orb_base LIBS ${CMAKE_DL_LIBS})
# Public API only, against the shared library (its export list included).
orb_unit_test(test_rdma_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma_config.c LIBS orbite)
# Corpus replay of the RDMA settings parser; libFuzzer target (clang):
# ./fuzz_rdma_config -max_len=4096 tests/core/rdma_config_corpus
orb_fuzz_target(fuzz_rdma_config HARNESS ${CMAKE_CURRENT_LIST_DIR}/fuzz_rdma_config.c
                CORPUS ${CMAKE_CURRENT_LIST_DIR}/rdma_config_corpus
                OBJECTS orb_base orb_config
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/core/rdma_config.c ${PROJECT_SOURCE_DIR}/lib/core/config.c
                FUZZ_OBJECTS orb_base LIBS PkgConfig::JANSSON)
# Thread names: the helper alone, and an engine's threads through the public API.
orb_unit_test(test_thread_name SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_thread_name.c OBJECTS orb_base LIBS orbite)
# Random bytes: the per-thread pool never hands a value out twice (threads, refills, fork).
orb_unit_test(test_random SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_random.c OBJECTS orb_base LIBS Threads::Threads)
# The engine's shared staging pool: bound, sources' reserve, waiters, bounded waits, kept chunks.
orb_unit_test(test_stage_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage_pool.c OBJECTS orb_base orb_mem
              LIBS Threads::Threads)
