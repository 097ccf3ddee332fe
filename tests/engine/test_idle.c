/* Idle engines cost next to nothing: a same-host connection with nothing to do wakes its
 * source's ring thread about once a second (it woke fifty times a second), and a request after
 * a long idle still completes at once, byte for byte (the requester's wake-up brings the thread
 * back; no timer is needed for it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "util.h"
#include "../util/thread_use.h"

#define LEN (256u * 1024)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* WRITE the local region's [off, off + len) over the same-host transport, and check the bytes. */
static uint64_t write_checked(struct eu_pair *p, size_t off, size_t len)
{
    for (size_t i = 0; i < len; i++)
        p->local.base[off + i] = (uint8_t)(i * 7 + off);
    struct orb_request r = eu_req(ORB_OP_WRITE, p->local.base + off, p->remote.base + off, len);
    r.transport = ORB_TRANSPORT_SHM;
    struct orb_batch_report rep;
    uint64_t t0 = now_ns();
    int rc = orb_submit_and_wait(p->req, p->seg, &r, 1, NULL, 10ull * 1000000000ull, &rep);
    uint64_t took = now_ns() - t0;
    if (rc != 0)
        fail_msg("a same-host WRITE: %s (%s)", orb_strerror(rc), orb_last_error());
    assert_memory_equal(p->remote.base + off, p->local.base + off, len);
    return took;
}

/* The pair is closed by the teardown, which runs after a failed check too. */
static int pair_open(void **state)
{
    static struct eu_pair pair;
    eu_pair_open(&pair, 1, 64 * 1024, LEN, 0x21, 0x42);
    *state = &pair;
    return 0;
}

static int pair_close(void **state)
{
    eu_pair_close(*state);
    return 0;
}

static void test_an_idle_same_host_connection_sleeps(void **state)
{
    struct eu_pair *p = *state;
    (void)write_checked(p, 0, 4096); /* the connection and its ring thread are up */
    /* One ring thread, found by its name. It may not have slept yet: after a request it can
     * spin busy_poll_us before its first wait. */
    assert_int_equal(thread_use_of("orb-shm-ring").threads, 1);
    sleep_ms(1500); /* its sleeps have grown */
    struct thread_use before = thread_use_of("orb-shm-ring");
    sleep_ms(2000);
    struct thread_use after = thread_use_of("orb-shm-ring");
    assert_int_equal(after.threads, 1);
    assert_true(before.sleeps > 0);
    unsigned long long woke = after.sleeps - before.sleeps;
    print_message("an idle same-host connection's ring thread woke %llu times in 2 s\n", woke);
    assert_true(woke <= 10);
    uint64_t took = write_checked(p, 8192, 64 * 1024);
    print_message("the first WRITE after the idle time took %llu us\n", (unsigned long long)(took / 1000));
    assert_true(took < 500ull * 1000000ull); /* not a sleep's length */
}

int main(void)
{
    /* Shareable regions and requests that name the same-host transport (util.c). */
    setenv("ORB_TEST_TRANSPORT", "shm", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_an_idle_same_host_connection_sleeps, pair_open, pair_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
