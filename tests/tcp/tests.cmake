# The TCP transport against a fake engine (tests/tcp/harness.c stands in for engine.c/batch.c).
orb_unit_test(test_tcp
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tcp.c ${CMAKE_CURRENT_LIST_DIR}/harness.c
  OBJECTS orb_base orb_wire orb_mem orb_config orb_tcp)
# A submitter stalled inside sendmsg() (interposed with --wrap) must never stall a worker.
orb_unit_test(test_tcp_stall
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tcp_stall.c ${CMAKE_CURRENT_LIST_DIR}/harness.c
  OBJECTS orb_base orb_wire orb_mem orb_config orb_tcp)
target_link_options(test_tcp_stall PRIVATE -Wl,--wrap=sendmsg)
# System calls per request on the data path, counted through interposed socket calls.
orb_unit_test(test_tcp_batching
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tcp_batching.c ${CMAKE_CURRENT_LIST_DIR}/harness.c
  OBJECTS orb_base orb_wire orb_mem orb_config orb_tcp)
target_link_options(test_tcp_batching PRIVATE -Wl,--wrap=sendmsg -Wl,--wrap=recv -Wl,--wrap=readv)
# Stripes per peer seen from the network: another network namespace gets tcp_stripes, loopback
# and the namespace's own address tcp_local_stripes (root and iproute2, else skipped).
if(TARGET orbite-bench)
  add_test(NAME test_stripes_netns
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_stripes_netns.sh $<TARGET_FILE:orbite-bench>)
  set_tests_properties(test_stripes_netns PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
