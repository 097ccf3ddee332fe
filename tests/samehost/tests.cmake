# Same-host proof and ring (lib/samehost/): unit tests, and the HELLO decoder's fuzz target and corpus.
set(ORB_SAMEHOST_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
orb_unit_test(test_samehost_proof SOURCES ${ORB_SAMEHOST_TEST_DIR}/test_samehost_proof.c
              OBJECTS orb_base orb_samehost)
# Corpus replay in ctest (python3 tests/samehost/gen_corpus.py writes it); libFuzzer target:
# ./fuzz_samehost_hello -max_len=256 tests/samehost/corpus
orb_fuzz_target(fuzz_samehost_hello HARNESS ${ORB_SAMEHOST_TEST_DIR}/fuzz_samehost_hello.c
                CORPUS ${ORB_SAMEHOST_TEST_DIR}/corpus OBJECTS orb_base orb_samehost
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/samehost/proof.c FUZZ_OBJECTS orb_base)
# The shared-memory ring (lib/samehost/ring.c): order, wrap-around, hostile indices, waiting,
# two processes.
orb_unit_test(test_samehost_ring SOURCES ${ORB_SAMEHOST_TEST_DIR}/test_samehost_ring.c
              OBJECTS orb_base orb_samehost)
# The same-host transport's messages (lib/samehost/shm_msg.c): literal vectors, round trips, every
# decoder's refusals.
orb_unit_test(test_samehost_msg SOURCES ${ORB_SAMEHOST_TEST_DIR}/test_samehost_msg.c
              OBJECTS orb_base orb_samehost)
# Corpus replay in ctest (python3 tests/samehost/gen_shm_corpus.py writes it); libFuzzer target:
# ./fuzz_shm_msg -max_len=128 tests/samehost/shm_corpus
orb_fuzz_target(fuzz_shm_msg HARNESS ${ORB_SAMEHOST_TEST_DIR}/fuzz_shm_msg.c
                CORPUS ${ORB_SAMEHOST_TEST_DIR}/shm_corpus OBJECTS orb_base orb_samehost
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/samehost/shm_msg.c ${PROJECT_SOURCE_DIR}/lib/samehost/proof.c
                             ${PROJECT_SOURCE_DIR}/lib/samehost/ring.c
                FUZZ_OBJECTS orb_base)
# The source against a hostile requester speaking the socket and ring protocol by hand.
orb_unit_test(test_shm_hostile SOURCES ${ORB_SAMEHOST_TEST_DIR}/test_shm_hostile.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg
                      orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
# The requester against a hostile source (a real source's socket taken over by the test).
orb_unit_test(test_shm_hostile_source SOURCES ${ORB_SAMEHOST_TEST_DIR}/test_shm_hostile_source.c
              OBJECTS orb_base orb_wire orb_mem orb_config orb_engine_core orb_tcp orb_topo orb_rdma
                      orb_rdma_tp orb_helperlib orb_hproto orb_cuda orb_cuda_reg orb_nvlink orb_nvlink_msg
                      orb_samehost orb_shm
              LIBS ${CMAKE_DL_LIBS})
