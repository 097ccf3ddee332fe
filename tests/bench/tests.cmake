# orbite-bench: unit tests of its parsing and verification helpers, and end-to-end runs of the
# tool (a forked source over loopback TCP, and over the same-host transport) when it is built.
set(ORB_BENCH_SRC ${PROJECT_SOURCE_DIR}/tools/orbite-bench)
orb_unit_test(test_bench
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bench.c ${ORB_BENCH_SRC}/options.c
          ${ORB_BENCH_SRC}/pattern.c ${ORB_BENCH_SRC}/util.c
  LIBS orbite m)
target_include_directories(test_bench PRIVATE ${ORB_BENCH_SRC})

if(TARGET orbite-bench)
  # Every cell must run and verify byte for byte: READ and WRITE, small and striped sizes.
  add_test(NAME bench_smoke
           COMMAND orbite-bench --duration 0.3 --warmup 0.1 --block-size 4K,2M --batch 4
                   --buffer-size 32M --quiet --no-progress)
  # Several threads, synchronous batches, latency cells with one request per batch.
  add_test(NAME bench_smoke_threads
           COMMAND orbite-bench --duration 0.3 --warmup 0 --block-size 64K --batch 1 --depth 1
                   --threads 3 --buffer-size 8M --json --quiet)
  # A measured time far shorter than one batch (64 MiB with a cold first batch): each thread
  # still measures a batch, pipelined and synchronous, instead of reporting nothing.
  add_test(NAME bench_window_shorter_than_a_batch
           COMMAND orbite-bench --op both --duration 0.01 --warmup 0.01 --block-size 32M --batch 2
                   --depth 1 --buffer-size 64M --json --quiet)
  add_test(NAME bench_window_shorter_than_a_batch_pipelined
           COMMAND orbite-bench --op read --duration 0.01 --warmup 0.01 --block-size 16M --batch 2
                   --depth 2 --buffer-size 64M --json --quiet)
  set_tests_properties(bench_window_shorter_than_a_batch bench_window_shorter_than_a_batch_pipelined
                       PROPERTIES TIMEOUT 120 FAIL_REGULAR_EXPRESSION "\"ok\":false|\"batches\":0"
                       PASS_REGULAR_EXPRESSION "\"ran\":true,\"verified\":true")
  # The same-host transport (the requester's buffers from orb_host_memory_alloc_shared, the
  # forked source copying): READ and WRITE, small blocks in batches and 1 MiB blocks, every cell
  # verified byte for byte.
  add_test(NAME bench_shm_4k
           COMMAND orbite-bench --transport shm --op both --duration 0.3 --warmup 0.1 --block-size 4K
                   --batch 16 --depth 2 --buffer-size 32M --json --quiet)
  add_test(NAME bench_shm_1m
           COMMAND orbite-bench --transport shm --op both --duration 0.3 --warmup 0.1 --block-size 1M
                   --batch 16 --depth 2 --buffer-size 32M --json --quiet)
  set_tests_properties(bench_shm_4k bench_shm_1m PROPERTIES TIMEOUT 120
                       FAIL_REGULAR_EXPRESSION "\"ok\":false|\"verified\":(false|null)"
                       PASS_REGULAR_EXPRESSION "\"transport\":\"shm\".*\"ok\":true")
  # Usage errors exit 2; an unreachable source exits 1 promptly instead of hanging.
  add_test(NAME bench_usage_error
           COMMAND sh -c "\"$0\" --batch 0 2>/dev/null; test $? -eq 2" $<TARGET_FILE:orbite-bench>)
  add_test(NAME bench_unreachable_source
           COMMAND sh -c "\"$0\" --mode requester --endpoint 127.0.0.1:1 --epoch 00112233445566778899aabbccddeeff --quiet; test $? -eq 1"
                   $<TARGET_FILE:orbite-bench>)
  # The JSON reports both processes' CPU time over the measured time, per GB.
  set_tests_properties(bench_smoke_threads PROPERTIES
                       PASS_REGULAR_EXPRESSION "\"cpu_source_s\":[0-9.]+,\"cpu_s_per_gb\":[0-9.]+"
                       FAIL_REGULAR_EXPRESSION "\"ok\":false")
  set_tests_properties(bench_smoke bench_smoke_threads bench_usage_error bench_unreachable_source
                       PROPERTIES TIMEOUT 120)
endif()

# The tool with device memory, on the CUDA stand-in: its own sources, linked with the static
# library and the hook that picks the stand-in before main (each process of the run, the forked
# source too, loads it on its first CUDA call). Every cell verifies byte for byte.
if(TARGET orbite-bench)
  add_executable(orbite-bench-fakecuda ${ORB_BENCH_SRC}/main.c ${ORB_BENCH_SRC}/options.c ${ORB_BENCH_SRC}/source.c
                 ${ORB_BENCH_SRC}/requester.c ${ORB_BENCH_SRC}/pattern.c ${ORB_BENCH_SRC}/util.c
                 ${PROJECT_SOURCE_DIR}/tests/fakecuda/use_fakecuda.c)
  target_include_directories(orbite-bench-fakecuda PRIVATE ${PROJECT_SOURCE_DIR}/lib)
  target_link_libraries(orbite-bench-fakecuda PRIVATE orbite_static PkgConfig::JANSSON Threads::Threads m
                        ${CMAKE_DL_LIBS})
  add_dependencies(orbite-bench-fakecuda orb_fakecuda_full)
  target_compile_definitions(orbite-bench-fakecuda PRIVATE FAKECUDA_FULL="$<TARGET_FILE:orb_fakecuda_full>")
  add_test(NAME bench_cuda_both
           COMMAND orbite-bench-fakecuda --memory cuda --duration 0.3 --warmup 0.05 --block-size 4K,3M
                   --batch 4 --buffer-size 32M --json --quiet)
  add_test(NAME bench_cuda_one_side
           COMMAND orbite-bench-fakecuda --source-memory cuda:1 --requester-memory host --duration 0.3
                   --warmup 0 --block-size 64K --batch 2 --threads 2 --buffer-size 8M --json --quiet)
  add_test(NAME bench_cuda_requester_only
           COMMAND orbite-bench-fakecuda --requester-memory cuda:1 --duration 0.3 --warmup 0
                   --block-size 1M --batch 2 --buffer-size 8M --json --quiet)
  # Device memory of two processes by CUDA IPC (the forked source's allocation imported).
  add_test(NAME bench_cuda_nvlink
           COMMAND orbite-bench-fakecuda --memory cuda --transport nvlink --duration 0.3 --warmup 0.05
                   --block-size 4K,3M --batch 4 --buffer-size 32M --json --quiet)
  # A pass expression makes ctest ignore the exit status: each names the memory both sides ran
  # on and the run's "ok":true.
  set(ORB_BENCH_OK "\"ok\":true")
  set_tests_properties(bench_cuda_both PROPERTIES PASS_REGULAR_EXPRESSION
                       "\"transport\":\"tcp\".*\"source_memory\":\"cuda:0\",\"requester_memory\":\"cuda:0\".*${ORB_BENCH_OK}")
  set_tests_properties(bench_cuda_nvlink PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
                       "\"transport\":\"nvlink\".*\"source_memory\":\"cuda:0\",\"requester_memory\":\"cuda:0\".*${ORB_BENCH_OK}")
  set_tests_properties(bench_cuda_one_side PROPERTIES PASS_REGULAR_EXPRESSION
                       "\"source_memory\":\"cuda:1\",\"requester_memory\":\"host\".*${ORB_BENCH_OK}")
  set_tests_properties(bench_cuda_requester_only PROPERTIES PASS_REGULAR_EXPRESSION
                       "\"source_memory\":\"host\",\"requester_memory\":\"cuda:1\".*${ORB_BENCH_OK}")
  set_tests_properties(bench_cuda_both bench_cuda_nvlink bench_cuda_one_side bench_cuda_requester_only PROPERTIES
                       FAIL_REGULAR_EXPRESSION "\"ok\":false|\"verified\":false")
  set_tests_properties(bench_cuda_both bench_cuda_one_side bench_cuda_requester_only PROPERTIES TIMEOUT 120)
endif()

# Device selection micro-benchmark (tests/bench/topo_bench.c): an executable to run by hand,
# `topo_bench [--iterations N]`, and a short smoke run that fails if a timed loop allocates.
set(ORB_TOPO_BENCH_WRAPS malloc calloc realloc free aligned_alloc posix_memalign clock_gettime
    gettimeofday syscall sched_yield nanosleep)
add_executable(topo_bench ${CMAKE_CURRENT_LIST_DIR}/topo_bench.c
               ${PROJECT_SOURCE_DIR}/tests/topo_select/call_counter.c
               $<TARGET_OBJECTS:orb_base> $<TARGET_OBJECTS:orb_topo>)
target_include_directories(topo_bench PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/lib
                           ${PROJECT_SOURCE_DIR}/tests/topo_select)
target_link_libraries(topo_bench PRIVATE PkgConfig::JANSSON Threads::Threads)
foreach(w ${ORB_TOPO_BENCH_WRAPS})
  target_link_options(topo_bench PRIVATE -Wl,--wrap=${w})
endforeach()
add_test(NAME topo_bench_smoke COMMAND topo_bench --iterations 2000 --repeat 1)
set_tests_properties(topo_bench_smoke PROPERTIES TIMEOUT 60)

# Helper round trips (tests/bench/helper_bench.c): session start and end, and one exchange of
# each request kind, through the library's client against the helper's test build. An
# executable to run by hand, `helper_bench [--sessions N] [--iterations N]`, and a smoke run
# that fails on any unexpected answer.
if(TARGET orbite-helper-test)
  add_executable(helper_bench ${CMAKE_CURRENT_LIST_DIR}/helper_bench.c $<TARGET_OBJECTS:orb_base>
                 $<TARGET_OBJECTS:orb_wire> $<TARGET_OBJECTS:orb_hproto> $<TARGET_OBJECTS:orb_helperlib>
                 $<TARGET_OBJECTS:orb_topo>)
  target_include_directories(helper_bench PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                             ${PROJECT_SOURCE_DIR}/lib ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(helper_bench PRIVATE PkgConfig::JANSSON Threads::Threads)
  target_compile_definitions(helper_bench PRIVATE HELPER_TEST_PATH="$<TARGET_FILE:orbite-helper-test>"
                             FIXTURE_DIR="${PROJECT_SOURCE_DIR}/tests/data/sysfs")
  add_dependencies(helper_bench orbite-helper-test)
  add_test(NAME helper_bench_smoke COMMAND helper_bench --sessions 3 --iterations 200)
  set_tests_properties(helper_bench_smoke PROPERTIES TIMEOUT 60)
endif()

# Same-host copy mechanisms (tests/bench/samehost_bench.c): a program to run by hand,
# `samehost_bench [--size BYTES] [--rounds N] [--json]`, and a short run that fails when a
# mechanism moved wrong bytes (one the kernel refuses is reported, not failed).
add_executable(samehost_bench ${CMAKE_CURRENT_LIST_DIR}/samehost_bench.c)
target_link_libraries(samehost_bench PRIVATE Threads::Threads)
add_test(NAME samehost_bench_smoke COMMAND samehost_bench --size 8388608 --rounds 1 --json)
set_tests_properties(samehost_bench_smoke PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION "\"ok\":true")
