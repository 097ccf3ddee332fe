/* Monotonic time and deadline arithmetic. */
#include "clock.h"

#include <limits.h>
#include <orbite/orbite.h>

uint64_t orb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * ORB_NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t orb_deadline_after(uint64_t timeout_ns)
{
    if (timeout_ns == ORB_TIMEOUT_INFINITE)
        return ORB_DEADLINE_NONE;
    uint64_t now = orb_now_ns();
    if (timeout_ns >= ORB_DEADLINE_NONE - now)
        return ORB_DEADLINE_NONE;
    return now + timeout_ns;
}

int orb_deadline_poll_ms(uint64_t deadline)
{
    if (deadline == ORB_DEADLINE_NONE)
        return -1;
    uint64_t now = orb_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

struct timespec orb_deadline_timespec(uint64_t deadline)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline / ORB_NS_PER_SEC);
    ts.tv_nsec = (long)(deadline % ORB_NS_PER_SEC);
    return ts;
}

int orb_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}
