/* An application thread preempted in the middle of sending must not stall the epoll worker.
 *
 * sendmsg() is interposed (linked with --wrap=sendmsg): for one chosen thread it puts the bytes
 * on the wire and then blocks before returning, exactly like a submitter that is descheduled
 * after its frames left but before it accounted for them. Meanwhile the source answers those
 * frames. A requester engine with a single worker must go on serving its other connections, and
 * finish the stalled connection's work once the thread resumes; the same holds when the stalled
 * connection is torn down while its sender is stuck. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "harness.h"
#include "tcp/tcp_internal.h"

static const struct orb_transport_ops *const T = &orb_tcp_transport;

/* ---- the interposer ------------------------------------------------------------------------ */

ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);

static pthread_mutex_t stall_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stall_cond = PTHREAD_COND_INITIALIZER;
static pthread_t stall_thread;
static int stall_armed;    /* the next sendmsg() of stall_thread stalls */
static int stall_entered;  /* it is stalled now */
static int stall_release;  /* let it return */

ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    ssize_t n = __real_sendmsg(fd, msg, flags);
    pthread_mutex_lock(&stall_lock);
    if (stall_armed && pthread_equal(pthread_self(), stall_thread)) {
        stall_armed = 0;
        stall_entered = 1;
        pthread_cond_broadcast(&stall_cond);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30; /* never hang the test run */
        while (!stall_release)
            if (pthread_cond_timedwait(&stall_cond, &stall_lock, &until) != 0)
                break;
        stall_entered = 0;
    }
    pthread_mutex_unlock(&stall_lock);
    return n;
}

static void stall_arm(pthread_t t)
{
    pthread_mutex_lock(&stall_lock);
    stall_thread = t;
    stall_armed = 1;
    stall_release = 0;
    pthread_mutex_unlock(&stall_lock);
}

static void stall_wait_entered(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&stall_lock);
    while (!stall_entered)
        if (pthread_cond_timedwait(&stall_cond, &stall_lock, &until) != 0)
            break;
    int entered = stall_entered;
    pthread_mutex_unlock(&stall_lock);
    assert_true(entered);
}

static void stall_let_go(void)
{
    pthread_mutex_lock(&stall_lock);
    stall_release = 1;
    stall_armed = 0;
    pthread_cond_broadcast(&stall_cond);
    pthread_mutex_unlock(&stall_lock);
}

/* ---- a submitter thread ---------------------------------------------------------------------- */

struct submitter {
    void *peer;
    struct th_xfer *xfers;
    size_t n;
    int rc;
    pthread_t thread;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    struct orb_xfer *xp[16];
    for (size_t i = 0; i < s->n; i++)
        xp[i] = &s->xfers[i].x;
    s->rc = T->peer_submit(s->peer, xp, s->n);
    return NULL;
}

static orb_engine *single_worker_requester(void)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    cfg.tcp_workers = 1; /* every connection of every peer on one worker */
    cfg.io_timeout_s = 30;
    cfg.tcp_socket_buffer = 256 * 1024; /* a large WRITE cannot leave in one sendmsg() */
    return th_engine_new(&cfg);
}

/* Start a submitter thread that stalls in its first sendmsg(), and wait until it does. */
static void start_stalled(struct submitter *s)
{
    /* The thread must exist before it can be armed; it submits only once armed. */
    pthread_mutex_lock(&stall_lock);
    assert_int_equal(pthread_create(&s->thread, NULL, submit_main, s), 0);
    stall_thread = s->thread;
    stall_armed = 1;
    stall_release = 0;
    pthread_mutex_unlock(&stall_lock);
    stall_wait_entered();
}

static void test_answer_to_a_stalled_sender(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = single_worker_requester();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 1 << 20, ORB_PERM_REMOTE_WRITE, 5, &owner);
    void *a = th_open(req, src);
    void *b = th_open(req, src);

    /* A's submitter puts READ frames on the wire and stalls before accounting for them. The
     * source answers them; the worker must not sit waiting for the stalled thread. */
    uint8_t *la = calloc(4, 4096);
    assert_non_null(la);
    struct th_xfer ta[4];
    for (int i = 0; i < 4; i++)
        th_xfer_init(&ta[i], ORB_XFER_READ, la + 4096 * i, remote + 4096 * i, 4096, NULL);
    struct submitter sa = {.peer = a, .xfers = ta, .n = 4};
    start_stalled(&sa);
    usleep(50 * 1000); /* the answers are in by now */

    /* B, on the same single worker, still runs to completion. */
    uint8_t lb[4096];
    struct th_xfer tb;
    th_xfer_init(&tb, ORB_XFER_READ, lb, remote + 8192, sizeof lb, NULL);
    struct orb_xfer *xp = &tb.x;
    assert_int_equal(T->peer_submit(b, &xp, 1), 0);
    assert_int_equal(th_wait(&tb, 1, 5 * TH_SEC), 0);
    assert_int_equal(tb.status, 0);
    assert_memory_equal(lb, remote + 8192, sizeof lb);
    for (int i = 0; i < 4; i++)
        assert_int_equal(th_done_calls(&ta[i]), 0); /* held until the sender accounts */

    /* The sender resumes, accounts for its frames and hands the answers back. */
    stall_let_go();
    pthread_join(sa.thread, NULL);
    assert_int_equal(sa.rc, 0);
    assert_int_equal(th_wait(ta, 4, 5 * TH_SEC), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ta[i].status, 0);
        assert_memory_equal(la + 4096 * i, remote + 4096 * i, 4096);
    }

    T->peer_release(a);
    T->peer_release(b);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(la);
}

static void test_teardown_under_a_stalled_sender(void **state)
{
    (void)state;
    orb_engine *dying = th_engine_new(NULL);
    orb_engine *other = th_engine_new(NULL);
    orb_engine *req = single_worker_requester();
    orb_host_memory *o1, *o2;
    uint8_t *r1 = th_region(dying, 8u << 20, ORB_PERM_REMOTE_WRITE, 6, &o1);
    uint8_t *r2 = th_region(other, 1 << 20, ORB_PERM_REMOTE_WRITE, 7, &o2);
    void *a = th_open(req, dying);
    void *b = th_open(req, other);

    /* A WRITE larger than the socket takes at once: the stalled sender has more to send, and
     * the source cannot have answered it. */
    size_t big = 8u << 20;
    uint8_t *la = malloc(big);
    assert_non_null(la);
    memset(la, 0x5a, big);
    struct th_xfer ta;
    th_xfer_init(&ta, ORB_XFER_WRITE, la, r1, big, NULL);
    struct submitter sa = {.peer = a, .xfers = &ta, .n = 1};
    start_stalled(&sa);

    /* A's source goes away: the worker sees the connection die while A's sender is stuck in
     * sendmsg() on it, and must not wait for it. */
    th_engine_free(dying);
    usleep(50 * 1000);
    uint8_t lb[4096];
    struct th_xfer tb;
    th_xfer_init(&tb, ORB_XFER_READ, lb, r2, sizeof lb, NULL);
    struct orb_xfer *xp = &tb.x;
    assert_int_equal(T->peer_submit(b, &xp, 1), 0);
    assert_int_equal(th_wait(&tb, 1, 5 * TH_SEC), 0);
    assert_int_equal(tb.status, 0);
    assert_memory_equal(lb, r2, sizeof lb);

    /* Once the sender lets go, the teardown finishes and A's WRITE fails for good. */
    stall_let_go();
    pthread_join(sa.thread, NULL);
    assert_int_equal(th_wait(&ta, 1, 10 * TH_SEC), 0);
    assert_int_equal(th_done_calls(&ta), 1);
    assert_int_equal(ta.status, ORB_EPEER);
    assert_int_equal(ta.effect, ORB_REMOTE_EFFECT_UNKNOWN);

    T->peer_release(a);
    T->peer_release(b);
    th_engine_free(req);
    th_engine_free(other);
    orb_host_memory_unref(o1);
    orb_host_memory_unref(o2);
    free(la);
}

int main(void)
{
    (void)stall_arm;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_to_a_stalled_sender),
        cmocka_unit_test(test_teardown_under_a_stalled_sender),
    };
    return cmocka_run_group_tests_name("tcp_stall", tests, NULL, NULL);
}
