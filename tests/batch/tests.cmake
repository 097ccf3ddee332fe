orb_unit_test(test_batch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_batch.c
              OBJECTS orb_base orb_mem orb_config orb_engine_core)
orb_unit_test(test_transports SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_transports.c
              OBJECTS orb_base orb_mem orb_config orb_engine_core)
