/* Random bytes from the kernel (see random.h). */
#include "random.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "error.h"

/* Small requests (grant nonces: one per grant) come from a per-thread pool the kernel fills
 * RANDOM_POOL bytes at a time, so that a grant costs no system call of its own. Each byte goes
 * out once and is wiped from the pool as it does. A fork child must not hand out the bytes its
 * parent holds too: a fork moves the generation on, and a pool of an older one is dropped. */
#define RANDOM_POOL 256u
#define RANDOM_POOLED_MAX 32u

static atomic_uint fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static _Thread_local struct {
    uint8_t bytes[RANDOM_POOL];
    uint32_t left;       /* bytes not handed out yet: the last `left` of `bytes` */
    unsigned generation; /* fork_generation when it was filled */
} pool;

static void after_fork_in_child(void)
{
    atomic_fetch_add(&fork_generation, 1);
}

static void register_atfork(void)
{
    (void)pthread_atfork(NULL, NULL, after_fork_in_child);
}

static int kernel_bytes(uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return orb_fail(ORB_EUNAVAILABLE, "getrandom failed: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    return 0;
}

int orb_random_bytes(void *buf, size_t n)
{
    if (n > RANDOM_POOLED_MAX)
        return kernel_bytes(buf, n);
    (void)pthread_once(&atfork_once, register_atfork);
    unsigned generation = atomic_load(&fork_generation);
    if (pool.generation != generation || pool.left < n) {
        int rc = kernel_bytes(pool.bytes, sizeof pool.bytes);
        if (rc != 0) {
            pool.left = 0;
            return rc;
        }
        pool.left = RANDOM_POOL;
        pool.generation = generation;
    }
    uint8_t *from = pool.bytes + (RANDOM_POOL - pool.left);
    memcpy(buf, from, n);
    memset(from, 0, n);
    pool.left -= (uint32_t)n;
    return 0;
}

uint64_t orb_random_u64(void)
{
    uint64_t v = 0;
    if (orb_random_bytes(&v, sizeof v) != 0)
        v = orb_now_ns() ^ (uint64_t)(uintptr_t)&v;
    return v;
}
