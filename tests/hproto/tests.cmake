# Helper protocol codec and datagram I/O: unit tests, corpus replay of the fuzz target, and (clang
# only) the libFuzzer target itself.
set(ORB_HPROTO_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_hproto SOURCES ${ORB_HPROTO_TEST_DIR}/test_hproto.c ${ORB_HPROTO_TEST_DIR}/hp_check.c
              OBJECTS orb_base orb_wire orb_hproto)

# Corpus replay in ctest; libFuzzer target: ./fuzz_hproto -max_len=4200 tests/hproto/corpus
orb_fuzz_target(fuzz_hproto
                HARNESS ${ORB_HPROTO_TEST_DIR}/fuzz_hproto.c ${ORB_HPROTO_TEST_DIR}/hp_check.c
                CORPUS ${ORB_HPROTO_TEST_DIR}/corpus OBJECTS orb_base orb_wire orb_hproto
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/common/helper_proto.c ${PROJECT_SOURCE_DIR}/lib/wire/wire.c
                FUZZ_OBJECTS orb_base)
