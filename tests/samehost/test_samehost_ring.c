/* The same-host shared-memory ring: arguments, order and wrap-around, a hostile peer's indices,
 * waiting (poll, futex, deadline), and two processes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "samehost/ring.h"

#define MSEC 1000000ull

struct shared_ring {
    uint8_t *mem;
    size_t len;
    struct orb_sh_ring prod, cons;
};

static void ring_new(struct shared_ring *s, uint32_t capacity)
{
    s->len = orb_sh_ring_bytes(capacity);
    assert_true(s->len > 0);
    s->mem = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(s->mem != MAP_FAILED);
    memset(s->mem, 0xee, s->len); /* whatever was there before: the creator's open clears it */
    assert_int_equal(orb_sh_ring_open(&s->cons, s->mem, s->len, capacity, ORB_SH_RING_CONSUMER, 1), 0);
    assert_int_equal(orb_sh_ring_open(&s->prod, s->mem, s->len, capacity, ORB_SH_RING_PRODUCER, 0), 0);
}

static void ring_free(struct shared_ring *s)
{
    munmap(s->mem, s->len);
}

static void entry_of(uint8_t e[ORB_SH_RING_ENTRY], uint64_t seq)
{
    for (unsigned i = 0; i < ORB_SH_RING_ENTRY; i++)
        e[i] = (uint8_t)(seq * 31u + i);
}

static void assert_entry(const uint8_t e[ORB_SH_RING_ENTRY], uint64_t seq)
{
    uint8_t want[ORB_SH_RING_ENTRY];
    entry_of(want, seq);
    assert_memory_equal(e, want, ORB_SH_RING_ENTRY);
}

/* The published words, where a hostile peer would write. */
static _Atomic uint32_t *tail_word(struct shared_ring *s)
{
    return (_Atomic uint32_t *)(void *)s->mem;
}

static _Atomic uint32_t *head_word(struct shared_ring *s)
{
    return (_Atomic uint32_t *)(void *)(s->mem + ORB_SH_RING_LINE);
}

static void test_arguments(void **state)
{
    (void)state;
    assert_int_equal(orb_sh_ring_bytes(0), 0);
    assert_int_equal(orb_sh_ring_bytes(3), 0);
    assert_int_equal(orb_sh_ring_bytes(ORB_SH_RING_MAX_CAPACITY * 2), 0);
    assert_int_equal(orb_sh_ring_bytes(1), 3 * ORB_SH_RING_LINE + ORB_SH_RING_ENTRY);
    size_t len = orb_sh_ring_bytes(8);
    uint8_t *mem = aligned_alloc(ORB_SH_RING_LINE, len + ORB_SH_RING_LINE);
    assert_non_null(mem);
    struct orb_sh_ring r;
    assert_int_equal(orb_sh_ring_open(NULL, mem, len, 8, ORB_SH_RING_CONSUMER, 1), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, NULL, len, 8, ORB_SH_RING_CONSUMER, 1), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, mem, len, 6, ORB_SH_RING_CONSUMER, 1), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, mem, len - 1, 8, ORB_SH_RING_CONSUMER, 1), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, mem + 8, len, 8, ORB_SH_RING_CONSUMER, 1), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, mem, len, 8, (enum orb_sh_ring_role)3, 1), ORB_EINVAL);
    /* Each side does only its own side's work. */
    assert_int_equal(orb_sh_ring_open(&r, mem, len, 8, ORB_SH_RING_CONSUMER, 1), 0);
    uint8_t e[ORB_SH_RING_ENTRY] = { 0 };
    assert_int_equal(orb_sh_ring_push(&r, e), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_pop(&r, NULL), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_open(&r, mem, len, 8, ORB_SH_RING_PRODUCER, 0), 0);
    assert_int_equal(orb_sh_ring_pop(&r, e), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_wait(&r, 0, 0), ORB_EINVAL);
    assert_int_equal(orb_sh_ring_push(&r, NULL), ORB_EINVAL);
    free(mem);
}

static void test_order_full_empty_and_wrap(void **state)
{
    (void)state;
    const uint32_t caps[] = { 1, 2, 4, 64 };
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        struct shared_ring s;
        ring_new(&s, caps[c]);
        uint8_t e[ORB_SH_RING_ENTRY];
        assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EAGAIN);
        uint64_t pushed = 0, popped = 0;
        /* Fill, drain, and run the indices around the ring (and past 2^16) many times. */
        for (int round = 0; round < 70000 / (int)caps[c] + 3; round++) {
            uint32_t n = (uint32_t)round % caps[c] + 1;
            for (uint32_t i = 0; i < n; i++) {
                entry_of(e, pushed);
                assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
                pushed++;
            }
            if (n == caps[c])
                assert_int_equal(orb_sh_ring_push(&s.prod, e), ORB_EAGAIN);
            for (uint32_t i = 0; i < n; i++) {
                assert_int_equal(orb_sh_ring_pop(&s.cons, e), 0);
                assert_entry(e, popped++);
            }
            assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EAGAIN);
        }
        assert_int_equal(pushed, popped);
        ring_free(&s);
    }
}

/* A peer that publishes an impossible index breaks the ring for good, and nothing beyond the
 * entries' memory is ever read or written whatever it publishes. */
/* Staged entries stay invisible until published, then come out in order; staging obeys the
 * capacity as pushing does, and a wake-up without an entry ends a sleeping wait. */
static void test_stage_then_publish(void **state)
{
    (void)state;
    struct shared_ring s;
    ring_new(&s, 4);
    uint8_t e[ORB_SH_RING_ENTRY];
    for (uint64_t i = 0; i < 4; i++) {
        entry_of(e, i);
        assert_int_equal(orb_sh_ring_stage(&s.prod, e), 0);
    }
    entry_of(e, 4);
    assert_int_equal(orb_sh_ring_stage(&s.prod, e), ORB_EAGAIN); /* full, though none is published */
    assert_int_equal(orb_sh_ring_pending(&s.cons), 0);
    assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EAGAIN);
    assert_int_equal(atomic_load(tail_word(&s)), 0);
    orb_sh_ring_publish(&s.prod);
    assert_int_equal(atomic_load(tail_word(&s)), 4);
    assert_int_equal(orb_sh_ring_pending(&s.cons), 1);
    for (uint64_t i = 0; i < 4; i++) {
        assert_int_equal(orb_sh_ring_pop(&s.cons, e), 0);
        assert_entry(e, i);
    }
    assert_int_equal(orb_sh_ring_pending(&s.cons), 0);
    /* Waiting past an index reads only the shared tail: past 0 at once, past 4 not before the
     * deadline. */
    assert_int_equal(orb_sh_ring_wait_at(&s.cons, 0, 0, orb_deadline_after(MSEC)), 0);
    assert_int_equal(orb_sh_ring_wait_at(&s.cons, 4, 0, orb_deadline_after(5 * MSEC)), ORB_ETIMEDOUT);
    assert_int_equal(orb_sh_ring_wait_at(&s.prod, 4, 0, orb_deadline_after(MSEC)), ORB_EINVAL);
    /* Publishing nothing new changes nothing. */
    orb_sh_ring_publish(&s.prod);
    assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EAGAIN);
    /* The consumer side cannot stage or publish. */
    assert_int_equal(orb_sh_ring_stage(&s.cons, e), ORB_EINVAL);
    orb_sh_ring_publish(&s.cons);
    assert_int_equal(atomic_load(tail_word(&s)), 4);
    ring_free(&s);
}

static void test_a_hostile_peer_breaks_the_ring(void **state)
{
    (void)state;
    uint8_t e[ORB_SH_RING_ENTRY];
    const uint32_t lies[] = { 5, 9, 0x80000000u, 0xffffffffu };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        struct shared_ring s;
        ring_new(&s, 4);
        entry_of(e, 1);
        assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
        /* A producer's tail more than a capacity ahead of the consumer's head. */
        atomic_store(tail_word(&s), lies[i]);
        assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EPROTO);
        atomic_store(tail_word(&s), 1);
        assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EPROTO); /* stays broken */
        /* wait returns at once so that the caller's pop learns it. */
        assert_int_equal(orb_sh_ring_wait(&s.cons, 0, orb_now_ns() + 10 * MSEC), 0);
        ring_free(&s);
    }
    /* A consumer's head past the producer's tail. The producer reads the head only when the
     * head it read last says the ring is full: the lie is found then, before any slot the
     * consumer may still be reading is written. */
    const uint32_t heads[] = { 5, 9, 0x80000000u, 0xfffffff0u };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        struct shared_ring s;
        ring_new(&s, 4);
        atomic_store(head_word(&s), heads[i]);
        for (unsigned k = 0; k < 4; k++)
            assert_int_equal(orb_sh_ring_push(&s.prod, e), 0); /* room, as far as it knows */
        assert_int_equal(orb_sh_ring_push(&s.prod, e), ORB_EPROTO);
        atomic_store(head_word(&s), 4);
        assert_int_equal(orb_sh_ring_push(&s.prod, e), ORB_EPROTO); /* stays broken */
        ring_free(&s);
    }
    /* A head that was honest when read and later passes the tail: found at the next read. */
    {
        struct shared_ring s;
        ring_new(&s, 4);
        for (unsigned k = 0; k < 4; k++)
            assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
        atomic_store(head_word(&s), 2);
        assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
        assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
        atomic_store(head_word(&s), 7); /* the tail is 6 */
        assert_int_equal(orb_sh_ring_push(&s.prod, e), ORB_EPROTO);
        ring_free(&s);
    }
    /* Attaching to a ring whose published indices are impossible fails. */
    struct shared_ring s;
    ring_new(&s, 4);
    atomic_store(tail_word(&s), 100);
    struct orb_sh_ring late;
    assert_int_equal(orb_sh_ring_open(&late, s.mem, s.len, 4, ORB_SH_RING_PRODUCER, 0), ORB_EPROTO);
    /* Put right, it attaches. */
    atomic_store(tail_word(&s), 0);
    assert_int_equal(orb_sh_ring_open(&late, s.mem, s.len, 4, ORB_SH_RING_PRODUCER, 0), 0);
    ring_free(&s);
}

static void test_wait_deadline(void **state)
{
    (void)state;
    struct shared_ring s;
    ring_new(&s, 4);
    const uint64_t polls[] = { 0, 5 * MSEC, 200 * MSEC };
    for (size_t i = 0; i < sizeof polls / sizeof polls[0]; i++) {
        uint64_t t0 = orb_now_ns();
        assert_int_equal(orb_sh_ring_wait(&s.cons, polls[i], t0 + 50 * MSEC), ORB_ETIMEDOUT);
        uint64_t took = orb_now_ns() - t0;
        assert_true(took >= 50 * MSEC);
        assert_true(took < 2000 * MSEC);
    }
    /* A deadline already passed: no wait at all. */
    uint64_t t0 = orb_now_ns();
    assert_int_equal(orb_sh_ring_wait(&s.cons, 10 * MSEC, t0 - 1), ORB_ETIMEDOUT);
    assert_true(orb_now_ns() - t0 < 5 * MSEC);
    /* Something there: at once. */
    uint8_t e[ORB_SH_RING_ENTRY];
    entry_of(e, 7);
    assert_int_equal(orb_sh_ring_push(&s.prod, e), 0);
    assert_int_equal(orb_sh_ring_wait(&s.cons, 0, t0 - 1), 0);
    ring_free(&s);
}

struct late_producer {
    struct orb_sh_ring *prod;
    uint64_t delay_ns;
    uint64_t count;
};

static void *produce(void *arg)
{
    struct late_producer *p = arg;
    struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)p->delay_ns };
    nanosleep(&ts, NULL);
    uint8_t e[ORB_SH_RING_ENTRY];
    for (uint64_t seq = 0; seq < p->count;) {
        entry_of(e, seq);
        int rc = orb_sh_ring_push(p->prod, e);
        if (rc == 0)
            seq++;
        else if (rc != ORB_EAGAIN)
            return (void *)1;
    }
    return NULL;
}

/* A sleeping consumer is woken by the push, polling or not, long before its deadline; and a
 * stream of entries through a small ring arrives complete and in order. */
static void test_wake_and_stream_between_threads(void **state)
{
    (void)state;
    const uint64_t polls[] = { 0, 1 * MSEC, 1000 * MSEC };
    for (size_t i = 0; i < sizeof polls / sizeof polls[0]; i++) {
        struct shared_ring s;
        ring_new(&s, 8);
        struct late_producer p = { .prod = &s.prod, .delay_ns = 30 * MSEC, .count = 20000 };
        pthread_t t;
        uint64_t t0 = orb_now_ns();
        assert_int_equal(pthread_create(&t, NULL, produce, &p), 0);
        uint8_t e[ORB_SH_RING_ENTRY];
        for (uint64_t seq = 0; seq < p.count; seq++) {
            int rc;
            while ((rc = orb_sh_ring_pop(&s.cons, e)) == ORB_EAGAIN)
                assert_int_equal(orb_sh_ring_wait(&s.cons, polls[i], orb_now_ns() + 5000 * MSEC), 0);
            assert_int_equal(rc, 0);
            assert_entry(e, seq);
            if (seq == 0) /* woken by the first push, not by the deadline */
                assert_true(orb_now_ns() - t0 < 3000 * MSEC);
        }
        void *res = NULL;
        pthread_join(t, &res);
        assert_null(res);
        ring_free(&s);
    }
}

/* Two processes: the child produces, the parent consumes (futex between processes). */
static void test_two_processes(void **state)
{
    (void)state;
    struct shared_ring s;
    ring_new(&s, 16);
    enum { COUNT = 50000 };
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct late_producer p = { .prod = &s.prod, .delay_ns = 20 * MSEC, .count = COUNT };
        _exit(produce(&p) == NULL ? 0 : 1);
    }
    uint8_t e[ORB_SH_RING_ENTRY];
    for (uint64_t seq = 0; seq < COUNT; seq++) {
        int rc;
        while ((rc = orb_sh_ring_pop(&s.cons, e)) == ORB_EAGAIN)
            assert_int_equal(orb_sh_ring_wait(&s.cons, seq % 2 ? 0 : 20000, orb_now_ns() + 10000 * MSEC), 0);
        assert_int_equal(rc, 0);
        assert_entry(e, seq);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(orb_sh_ring_pop(&s.cons, e), ORB_EAGAIN);
    ring_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_order_full_empty_and_wrap),
        cmocka_unit_test(test_stage_then_publish),
        cmocka_unit_test(test_a_hostile_peer_breaks_the_ring),
        cmocka_unit_test(test_wait_deadline),
        cmocka_unit_test(test_wake_and_stream_between_threads),
        cmocka_unit_test(test_two_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
