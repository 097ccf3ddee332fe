# Slicing, bandwidth estimators and the device selector. The allocation and system-call
# wrappers (-Wl,--wrap) let the tests prove that selection allocates nothing and calls nothing.
set(ORB_TOPO_SELECT_WRAPS malloc calloc realloc free aligned_alloc posix_memalign clock_gettime
    gettimeofday syscall sched_yield nanosleep)
orb_unit_test(test_topo_select
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_select.c ${CMAKE_CURRENT_LIST_DIR}/call_counter.c
  OBJECTS orb_base orb_topo LIBS m)
foreach(w ${ORB_TOPO_SELECT_WRAPS})
  target_link_options(test_topo_select PRIVATE -Wl,--wrap=${w})
endforeach()
