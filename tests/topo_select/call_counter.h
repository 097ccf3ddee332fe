/* Counts heap and system-call entry points made by the code linked into a test or benchmark.
 * The binary is linked with -Wl,--wrap=NAME for each wrapped function, so every call from its
 * own objects (not from shared libraries) goes through a counting wrapper first. */
#ifndef ORB_TEST_CALL_COUNTER_H
#define ORB_TEST_CALL_COUNTER_H

#include <stdint.h>

/* malloc, calloc, realloc, free, aligned_alloc, posix_memalign. */
uint64_t orb_test_heap_calls(void);

/* clock_gettime, gettimeofday, syscall, sched_yield, nanosleep. */
uint64_t orb_test_system_calls(void);

#endif
