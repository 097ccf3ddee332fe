# Wire protocol codec: unit tests, corpus replay of the fuzz target, and (clang only) the
# libFuzzer target itself.
set(ORB_WIRE_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_wire SOURCES ${ORB_WIRE_TEST_DIR}/test_wire.c OBJECTS orb_base orb_wire)

# Corpus replay in ctest; libFuzzer target: ./fuzz_wire -max_len=4096 tests/wire/corpus
orb_fuzz_target(fuzz_wire HARNESS ${ORB_WIRE_TEST_DIR}/fuzz_wire.c CORPUS ${ORB_WIRE_TEST_DIR}/corpus
                OBJECTS orb_base orb_wire
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/wire/wire.c FUZZ_OBJECTS orb_base)
