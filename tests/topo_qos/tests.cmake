# QoS tiers, promotion, deadline arbitration and admission; the shared slot object; rail health.
orb_unit_test(test_topo_qos SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_qos.c OBJECTS orb_base orb_topo)
# Count allocations made by the QoS code (its references to malloc/calloc are wrapped), to
# prove dispatch allocates nothing.
target_link_options(test_topo_qos PRIVATE -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc)
orb_unit_test(test_topo_slots SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_slots.c OBJECTS orb_base orb_topo)
orb_unit_test(test_topo_rail SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rail.c OBJECTS orb_base orb_topo)
