orb_unit_test(test_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory.c OBJECTS orb_base orb_mem)
orb_unit_test(test_registry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_registry.c OBJECTS orb_base orb_mem)
orb_unit_test(test_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config.c OBJECTS orb_base orb_config)
orb_unit_test(test_error SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_error.c OBJECTS orb_base)
