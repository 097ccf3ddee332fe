/* The counting wrappers behind call_counter.h. */
#include "call_counter.h"

#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/time.h>
#include <time.h>

static atomic_uint_fast64_t heap_calls;
static atomic_uint_fast64_t system_calls;

uint64_t orb_test_heap_calls(void)
{
    return atomic_load(&heap_calls);
}

uint64_t orb_test_system_calls(void)
{
    return atomic_load(&system_calls);
}

/* The real functions, and the wrappers the linker substitutes for them. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *ptr, size_t size);
void __real_free(void *ptr);
void *__real_aligned_alloc(size_t align, size_t size);
int __real_posix_memalign(void **out, size_t align, size_t size);
int __real_clock_gettime(clockid_t id, struct timespec *ts);
int __real_gettimeofday(struct timeval *tv, void *tz);
long __real_syscall(long number, ...);
int __real_sched_yield(void);
int __real_nanosleep(const struct timespec *req, struct timespec *rem);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *ptr, size_t size);
void __wrap_free(void *ptr);
void *__wrap_aligned_alloc(size_t align, size_t size);
int __wrap_posix_memalign(void **out, size_t align, size_t size);
int __wrap_clock_gettime(clockid_t id, struct timespec *ts);
int __wrap_gettimeofday(struct timeval *tv, void *tz);
long __wrap_syscall(long number, ...);
int __wrap_sched_yield(void);
int __wrap_nanosleep(const struct timespec *req, struct timespec *rem);

void *__wrap_malloc(size_t size)
{
    atomic_fetch_add(&heap_calls, 1);
    return __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    atomic_fetch_add(&heap_calls, 1);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *ptr, size_t size)
{
    atomic_fetch_add(&heap_calls, 1);
    return __real_realloc(ptr, size);
}

void __wrap_free(void *ptr)
{
    atomic_fetch_add(&heap_calls, 1);
    __real_free(ptr);
}

void *__wrap_aligned_alloc(size_t align, size_t size)
{
    atomic_fetch_add(&heap_calls, 1);
    return __real_aligned_alloc(align, size);
}

int __wrap_posix_memalign(void **out, size_t align, size_t size)
{
    atomic_fetch_add(&heap_calls, 1);
    return __real_posix_memalign(out, align, size);
}

int __wrap_clock_gettime(clockid_t id, struct timespec *ts)
{
    atomic_fetch_add(&system_calls, 1);
    return __real_clock_gettime(id, ts);
}

int __wrap_gettimeofday(struct timeval *tv, void *tz)
{
    atomic_fetch_add(&system_calls, 1);
    return __real_gettimeofday(tv, tz);
}

long __wrap_syscall(long number, ...)
{
    atomic_fetch_add(&system_calls, 1);
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    return __real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int __wrap_sched_yield(void)
{
    atomic_fetch_add(&system_calls, 1);
    return __real_sched_yield();
}

int __wrap_nanosleep(const struct timespec *req, struct timespec *rem)
{
    atomic_fetch_add(&system_calls, 1);
    return __real_nanosleep(req, rem);
}
