/* Internal: monotonic time and deadlines. */
#ifndef ORB_CORE_CLOCK_H
#define ORB_CORE_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define ORB_NS_PER_SEC 1000000000ull
#define ORB_DEADLINE_NONE UINT64_MAX

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t orb_now_ns(void);

/* Absolute deadline for a relative timeout; ORB_TIMEOUT_INFINITE (UINT64_MAX) and sums that
 * overflow give ORB_DEADLINE_NONE. */
uint64_t orb_deadline_after(uint64_t timeout_ns);

/* Milliseconds left until `deadline` for poll()/epoll_wait(): -1 for ORB_DEADLINE_NONE, 0 when
 * passed, otherwise rounded up and capped at INT32_MAX. */
int orb_deadline_poll_ms(uint64_t deadline);

/* An absolute CLOCK_MONOTONIC timespec for pthread_cond_timedwait (condvars created with
 * pthread_condattr_setclock(CLOCK_MONOTONIC)). Only valid when deadline != ORB_DEADLINE_NONE. */
struct timespec orb_deadline_timespec(uint64_t deadline);

/* Initialise `cond` on CLOCK_MONOTONIC, the clock orb_deadline_timespec() answers in. Returns
 * pthread_cond_init()'s result. */
int orb_cond_init_monotonic(pthread_cond_t *cond);

#endif
