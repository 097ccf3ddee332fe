# TENT priority matrices and location strings: unit and property tests, corpus replay of the
# fuzz target, and (clang only) the libFuzzer target itself.
set(ORB_TOPO_MATRIX_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

orb_unit_test(test_topo_location SOURCES ${ORB_TOPO_MATRIX_TEST_DIR}/test_location.c
              OBJECTS orb_base orb_topo)
orb_unit_test(test_topo_matrix SOURCES ${ORB_TOPO_MATRIX_TEST_DIR}/test_matrix.c
              OBJECTS orb_base orb_topo)

# Corpus replay in ctest (valid-* documents compile, bad-* are refused; inputs the fuzzer finds
# are added as crash-*); libFuzzer target: ./fuzz_matrix -max_len=8192 tests/topo_matrix/corpus
orb_fuzz_target(fuzz_matrix HARNESS ${ORB_TOPO_MATRIX_TEST_DIR}/fuzz_matrix.c
                CORPUS ${ORB_TOPO_MATRIX_TEST_DIR}/corpus OBJECTS orb_base orb_topo
                FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/lib/topo/matrix.c ${PROJECT_SOURCE_DIR}/lib/topo/location.c
                FUZZ_OBJECTS orb_base LIBS PkgConfig::JANSSON)
