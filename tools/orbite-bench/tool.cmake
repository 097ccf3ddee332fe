# orbite-bench: throughput and latency of READ/WRITE between a source and a requester.
# It uses the public API only and links the shared library like any application.
set(ORB_BENCH_DIR ${CMAKE_CURRENT_LIST_DIR})
add_executable(orbite-bench
  ${ORB_BENCH_DIR}/main.c
  ${ORB_BENCH_DIR}/options.c
  ${ORB_BENCH_DIR}/source.c
  ${ORB_BENCH_DIR}/requester.c
  ${ORB_BENCH_DIR}/pattern.c
  ${ORB_BENCH_DIR}/util.c)
target_link_libraries(orbite-bench PRIVATE orbite Threads::Threads m)
install(TARGETS orbite-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
