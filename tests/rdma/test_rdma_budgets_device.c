/* The RDMA budgets at their limits, between two engines on the rails topology's two "hosts"
 * (requester on rxe_a0/rxe_a1, source on rxe_b0/rxe_b1; or the NICs ORBITE_RDMA_REQUESTER_NICS
 * and ORBITE_RDMA_SOURCE_NICS name, as hardware/run.sh sets them): every exhausted budget is a clear
 * refusal or a wait that ends, never a crash or a hang, and the engine serves again once the
 * budget frees.
 *
 *  - max_endpoints at the requester: segments to one source share one connection (a second
 *    costs no queue pairs); a segment to another source whose queue pairs would exceed the budget
 *    has no RDMA path (requests naming RDMA fail naming the budget, TCP still works); closing
 *    the last segment of a connection frees its queue pairs and a new segment gets RDMA again;
 *  - max_endpoints at the source: its refusal reaches a second requester's segment the same way;
 *  - a connection's lanes: the smaller lane count of the two engines, fewer where max_endpoints
 *    at either end holds no more whole lanes;
 *  - max_cqes too small for a queue pair: no RDMA path, naming max_cqes;
 *  - max_grants 1 at the source: 32 concurrent requests all complete (the source answers "not
 *    now" and the requester asks again), every byte checked;
 *  - max_send_wr 1 at the requester: 4 x 4 MiB (64 slices each) wait for room in the send queue
 *    and complete, every byte checked;
 *  - memory-region bytes: the locked-memory limit (RLIMIT_MEMLOCK, CAP_IPC_LOCK dropped) lets
 *    one registration's MR copies in and not a second's: the second is refused with
 *    ORB_ERESOURCE naming the limit, its copies already made are let go (the pinned count says
 *    so), the first still carries RDMA, and once the first is gone the second registers and
 *    carries it;
 *  - max_window_key_indices 16 at the source: concurrent grants beyond the windows the history
 *    holds wait ("not now") and complete; once every index spent its keys the source refuses
 *    with ORB_ERESOURCE naming the budget, at once, each time, bytes intact, exact reports, and
 *    TCP still serves the segment (spent keys never come back: a history that frees would let
 *    an old key regain authority).
 *
 * A hardware check: it exits 77 without those devices; inside the test VM it runs for real. The
 * queue-pair counts assume two rails a side (one rail: max_endpoints 1 plays the same role). Each
 * engine here listens on an endpoint of its own: several run in one process. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/clock.h"
#include "core/engine_internal.h"
#include "device_util.h"
#include "rdma/rdma_data.h"
#include "rdma/rdma_transport.h"

#define TIMEOUT_NS (120ull * 1000000000ull)
#define SRC_LEN (16u << 20)
#define REQUESTER_NICS RDMA_TEST_REQUESTER_NICS
#define SOURCE_NICS RDMA_TEST_SOURCE_NICS

/* Queue pairs one segment takes at each end: one per rail. */
static const char *one_segment_of_qps(void)
{
    return strchr(REQUESTER_NICS, ',') != NULL ? "2" : "1";
}

static uint8_t pattern(uint64_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)seed;
}

/* An engine on `nics` with the settings kv[] (pairs, NULL-terminated); fails the test when it
 * cannot be made. */
static orb_engine *engine(const char *nics, int source, const char *const *kv)
{
    const char *all[16] = {"rdma_whitelist", nics};
    size_t n = 2;
    for (size_t i = 0; kv != NULL && kv[i] != NULL && n + 1 < sizeof all / sizeof all[0]; i++)
        all[n++] = kv[i];
    all[n] = NULL;
    orb_engine *e = NULL;
    if (rdma_test_engine(all, source, ORB_HELPER_OFF, &e) != 0)
        fail_msg("engine on %s: %s", nics, orb_last_error());
    return e;
}

struct side {
    orb_engine *e;
    orb_host_memory *mem;
    orb_reg_id id;
    uint8_t *bytes;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
};

static void side_up(struct side *s, const char *nics, int source, const char *const *kv)
{
    memset(s, 0, sizeof *s);
    s->e = engine(nics, source, kv);
    assert_int_equal(orb_host_memory_alloc(SRC_LEN, 0, &s->mem), 0);
    s->bytes = orb_host_memory_data(s->mem);
    for (uint64_t i = 0; i < SRC_LEN; i++)
        s->bytes[i] = source ? pattern(i, 1) : 0;
    assert_int_equal(orb_register_host_memory(s->e, s->mem, 0, SRC_LEN,
                                              source ? ORB_PERM_REMOTE_WRITE : ORB_PERM_LOCAL, &s->id),
                     0);
    if (source) {
        assert_int_equal(orb_engine_endpoint(s->e, s->endpoint, sizeof s->endpoint), 0);
        assert_int_equal(orb_engine_source_epoch(s->e, &s->epoch), 0);
    }
}

static void side_down(struct side *s)
{
    assert_int_equal(orb_unregister_memory(s->e, s->id), 0);
    orb_engine_free(s->e);
    orb_host_memory_unref(s->mem);
}

/* A source with settings src_kv and a requester with req_kv, and the requester's segment. */
static orb_segment *pair_up(struct side *src, const char *const *src_kv, struct side *req,
                            const char *const *req_kv)
{
    side_up(src, SOURCE_NICS, 1, src_kv);
    side_up(req, REQUESTER_NICS, 0, req_kv);
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(req->e, src->endpoint, &src->epoch, TIMEOUT_NS, &seg), 0);
    return seg;
}

static void pair_down(struct side *src, struct side *req, orb_segment *seg)
{
    orb_segment_close(seg);
    side_down(req);
    side_down(src);
}

/* n READs of `len` bytes each from the source's start into consecutive local ranges from
 * `at`, one batch, its report in *rep; the bytes of the completed prefix checked, and those of
 * requests after the failure's span untouched. */
static int reads_at(struct side *req, orb_segment *seg, const struct side *src, uint64_t at, uint32_t n, uint64_t len,
                    enum orb_transport t, struct orb_batch_report *rep)
{
    struct orb_request *r = calloc(n, sizeof *r);
    assert_non_null(r);
    for (uint32_t i = 0; i < n; i++) {
        r[i].transport = t;
        r[i].op = ORB_OP_READ;
        r[i].local_addr = (uint64_t)(uintptr_t)req->bytes + at + i * len;
        r[i].remote_addr = (uint64_t)(uintptr_t)src->bytes + i * len;
        r[i].length = len;
    }
    memset(req->bytes + at, 0, (size_t)(n * len));
    int rc = orb_submit_and_wait(req->e, seg, r, n, NULL, TIMEOUT_NS, rep);
    free(r);
    uint64_t good = rc == 0 ? n * len : rep->completed_requests * len;
    for (uint64_t i = 0; i < good; i++)
        if (req->bytes[at + i] != pattern(i, 1))
            fail_msg("byte %llu of %u x %llu differs", (unsigned long long)i, n, (unsigned long long)len);
    if (rc != 0 && rep->has_failure) {
        uint64_t after = (rep->failure.request_index + rep->failure.affected_requests) * len;
        for (uint64_t i = after; i < n * len; i++)
            if (req->bytes[at + i] != 0)
                fail_msg("byte %llu after the failure's span changed", (unsigned long long)i);
    }
    return rc;
}

/* n READs of `len` bytes each into consecutive local ranges, one batch; every byte checked. */
static int reads(struct side *req, orb_segment *seg, const struct side *src, uint32_t n, uint64_t len,
                 enum orb_transport t)
{
    struct orb_batch_report rep;
    return reads_at(req, seg, src, 0, n, len, t, &rep);
}

static int setup(void **state)
{
    (void)state;
    if (!rdma_test_present(REQUESTER_NICS) || !rdma_test_present(SOURCE_NICS)) {
        const char *topo = getenv("ORBITE_VM_TOPOLOGY");
        if (topo != NULL && strcmp(topo, "rails") == 0)
            fail_msg("the rails topology lacks its four rxe devices");
        printf("skipped: the devices %s and %s are not all here (the VM's rails topology has them)\n",
               REQUESTER_NICS, SOURCE_NICS);
        exit(77);
    }
    return 0;
}

/* Segments of `req` to one source share one connection: a second costs no queue pairs, and its
 * requests travel on RDMA too. */
static void two_segments_share(struct side *req, const struct side *src, orb_segment **one, orb_segment **two)
{
    assert_int_equal(orb_open_segment(req->e, src->endpoint, &src->epoch, TIMEOUT_NS, one), 0);
    assert_non_null((*one)->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(orb_open_segment(req->e, src->endpoint, &src->epoch, TIMEOUT_NS, two), 0);
    assert_non_null((*two)->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(stats_of(req->e).connections, 1);
    assert_int_equal(stats_of(src->e).source_connections, 1);
    assert_int_equal(reads(req, *two, src, 4, 65536, ORB_TRANSPORT_RDMA), 0);
    assert_int_equal(reads(req, *one, src, 4, 65536, ORB_TRANSPORT_RDMA), 0);
}

/* A segment of `req` to `src` that has no RDMA path because a max_endpoints budget is spent: it
 * says so, and TCP still carries its requests. */
static orb_segment *segment_without_rdma(struct side *req, const struct side *src)
{
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(req->e, src->endpoint, &src->epoch, TIMEOUT_NS, &seg), 0);
    assert_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(reads(req, seg, src, 1, 4096, ORB_TRANSPORT_RDMA), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "max_endpoints"));
    assert_int_equal(reads(req, seg, src, 4, 65536, ORB_TRANSPORT_UNSPEC), 0); /* TCP */
    return seg;
}

/* The requester's budget holds one connection: two segments to one source share it; a segment
 * to a second source has no RDMA path; the shared connection outlives its first segment; once
 * the last one closed (a lane reaps its queue pairs) the second source gets RDMA. */
static void test_requester_max_endpoints(void **state)
{
    (void)state;
    const char *const kv[] = {"max_endpoints", one_segment_of_qps(), NULL};
    struct side a, b, req;
    side_up(&a, SOURCE_NICS, 1, NULL);
    side_up(&b, SOURCE_NICS, 1, NULL);
    side_up(&req, REQUESTER_NICS, 0, kv);
    orb_segment *one, *two;
    two_segments_share(&req, &a, &one, &two);
    orb_segment *other = segment_without_rdma(&req, &b);
    orb_segment_close(other);
    orb_segment_close(one);
    assert_int_equal(stats_of(req.e).connections, 1);
    assert_int_equal(reads(&req, two, &a, 8, 65536 + 1, ORB_TRANSPORT_RDMA), 0);
    orb_segment_close(two);
    assert_int_equal(stats_of(req.e).connections, 0);
    uint64_t give_up = orb_now_ns() + 10ull * 1000000000ull;
    orb_segment *three = NULL;
    for (;;) {
        assert_int_equal(orb_open_segment(req.e, b.endpoint, &b.epoch, TIMEOUT_NS, &three), 0);
        if (three->peer[ORB_TRANSPORT_RDMA] != NULL || orb_now_ns() > give_up)
            break;
        orb_segment_close(three);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    assert_non_null(three->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(reads(&req, three, &b, 4, 65536, ORB_TRANSPORT_RDMA), 0);
    orb_segment_close(three);
    side_down(&req);
    side_down(&b);
    side_down(&a);
}

/* The source's budget holds one connection: one requester's two segments share it; a second
 * requester's segment has no RDMA path, and the source's refusal names the budget. */
static void test_source_max_endpoints(void **state)
{
    (void)state;
    const char *const kv[] = {"max_endpoints", one_segment_of_qps(), NULL};
    struct side src, first, second;
    side_up(&src, SOURCE_NICS, 1, kv);
    side_up(&first, REQUESTER_NICS, 0, NULL);
    side_up(&second, REQUESTER_NICS, 0, NULL);
    orb_segment *one, *two;
    two_segments_share(&first, &src, &one, &two);
    orb_segment *other = segment_without_rdma(&second, &src);
    assert_int_equal(reads(&first, one, &src, 8, 65536, ORB_TRANSPORT_RDMA), 0);
    orb_segment_close(other);
    orb_segment_close(two);
    orb_segment_close(one);
    side_down(&second);
    side_down(&first);
    side_down(&src);
}

/* The lanes of the segment's connection, and the queue pairs its engine holds. */
static uint32_t lanes_of(const orb_segment *seg, const struct side *req, uint32_t *qps)
{
    const struct rdma_seg *s = seg->peer[ORB_TRANSPORT_RDMA];
    struct orb_rdma_tp *tp = req->e->tp[ORB_TRANSPORT_RDMA].state;
    pthread_mutex_lock(&tp->lock);
    *qps = tp->endpoints;
    pthread_mutex_unlock(&tp->lock);
    return s->p->width;
}

/* A connection has the smaller lane count of the two engines, and no more lanes than a
 * max_endpoints budget holds whole (the queue pairs of a lane cut short are let go); its
 * requests move either way. */
static void test_lanes_narrow_to_what_both_ends_hold(void **state)
{
    (void)state;
    uint32_t rails = strchr(REQUESTER_NICS, ',') != NULL ? 2 : 1;
    uint32_t qps = 0;
    struct side src, req;
    static const char *const one_lane[] = {"num_lanes", "1", NULL};
    orb_segment *seg = pair_up(&src, one_lane, &req, NULL); /* the requester runs 2 lanes */
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(lanes_of(seg, &req, &qps), 1);
    assert_int_equal(qps, rails);
    assert_int_equal(reads(&req, seg, &src, 8, 65536 + 7, ORB_TRANSPORT_RDMA), 0);
    pair_down(&src, &req, seg);

    char budget[8];
    snprintf(budget, sizeof budget, "%u", rails + 1); /* a lane and a part of one */
    const char *const tight[] = {"max_endpoints", budget, NULL};
    seg = pair_up(&src, NULL, &req, tight);
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(lanes_of(seg, &req, &qps), 1);
    assert_int_equal(qps, rails);
    assert_int_equal(reads(&req, seg, &src, 8, 65536 + 7, ORB_TRANSPORT_RDMA), 0);
    pair_down(&src, &req, seg);

    seg = pair_up(&src, tight, &req, NULL); /* the source's budget narrows it the same way */
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(lanes_of(seg, &req, &qps), 1);
    assert_int_equal(qps, rails);
    assert_int_equal(reads(&req, seg, &src, 8, 65536 + 7, ORB_TRANSPORT_RDMA), 0);
    pair_down(&src, &req, seg);
}

static void test_max_cqes_too_small_for_a_queue_pair(void **state)
{
    (void)state;
    struct side src, req;
    static const char *const kv[] = {"max_cqes", "16", NULL};
    orb_segment *seg = pair_up(&src, NULL, &req, kv);
    assert_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(reads(&req, seg, &src, 1, 4096, ORB_TRANSPORT_RDMA), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "max_cqes"));
    assert_int_equal(reads(&req, seg, &src, 2, 65536, ORB_TRANSPORT_TCP), 0);
    pair_down(&src, &req, seg);
}

/* n READs of `len` bytes under the given settings, every byte checked; then both engines'
 * counters, read before the pair goes. */
static void reads_under(const char *const *src_kv, const char *const *req_kv, uint32_t n, uint64_t len,
                        struct orb_rdma_stats *src_stats, struct orb_rdma_stats *req_stats)
{
    struct side src, req;
    orb_segment *seg = pair_up(&src, src_kv, &req, req_kv);
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    assert_int_equal(reads(&req, seg, &src, n, len, ORB_TRANSPORT_RDMA), 0);
    assert_int_equal(orb_engine_rdma_stats(src.e, src_stats), 0);
    assert_int_equal(orb_engine_rdma_stats(req.e, req_stats), 0);
    pair_down(&src, &req, seg);
}

static void test_one_grant_at_a_time(void **state)
{
    (void)state;
    static const char *const kv[] = {"max_grants", "1", NULL};
    struct orb_rdma_stats ss, rs;
    reads_under(kv, NULL, 32, 65536 + 3, &ss, &rs);
    assert_true(ss.grants_served >= 32);
    assert_int_equal(ss.grants_active, 0);
}

static void test_one_send_wr_at_a_time(void **state)
{
    (void)state;
    static const char *const kv[] = {"max_send_wr", "1", NULL};
    struct orb_rdma_stats ss, rs;
    reads_under(NULL, kv, 4, 4u << 20, &ss, &rs);
    assert_true(rs.completed_reads >= 4 * 64);
    assert_int_equal(rs.requests_in_flight, 0);
}

/* This process's pinned memory in KiB (VmPin: every MR copy's pages count once more). */
static uint64_t pinned_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL)
        found = sscanf(line, "VmPin: %llu kB", &kib) == 1;
    fclose(f);
    assert_true(found);
    return kib;
}

/* Whether the gauge at `offset` of s's RDMA stats reaches `want` within `ns` (polled): the
 * release thread deregisters, and a served grant ends, a moment after the call that caused it. */
static bool gauge_settles(const struct side *s, size_t offset, uint64_t want, uint64_t ns)
{
    uint64_t give_up = orb_now_ns() + ns;
    for (;;) {
        struct orb_rdma_stats st = stats_of(s->e);
        uint64_t v;
        memcpy(&v, (const char *)&st + offset, sizeof v);
        if (v == want)
            return true;
        if (orb_now_ns() > give_up)
            return false;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}
#define REGIONS offsetof(struct orb_rdma_stats, memory_regions)

/* Turn CAP_IPC_LOCK in this thread's effective set on or off (the permitted set keeps it, so
 * it can come back); whether it was on before. Registration pins memory in the calling thread,
 * so this thread's set is the one the kernel asks. */
static bool ipc_lock_effective(bool on)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    assert_int_equal(syscall(SYS_capget, &h, d), 0);
    bool was = (d[0].effective >> CAP_IPC_LOCK) & 1u;
    bool can = (d[0].permitted >> CAP_IPC_LOCK) & 1u;
    if (on && !can)
        return was;
    if (on)
        d[0].effective |= 1u << CAP_IPC_LOCK;
    else
        d[0].effective &= ~(1u << CAP_IPC_LOCK);
    assert_int_equal(syscall(SYS_capset, &h, d), 0);
    return was;
}

static void test_locked_memory_limit(void **state)
{
    (void)state;
    struct side src, req;
    orb_segment *seg = pair_up(&src, NULL, &req, NULL);
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    /* What one registration of the whole buffer pins: a local-only MR copy per NIC, each the
     * whole range. */
    uint64_t copies = stats_of(req.e).memory_regions;
    uint64_t with = pinned_kib();
    assert_int_equal(orb_unregister_memory(req.e, req.id), 0);
    assert_true(gauge_settles(&req, REGIONS, 0, 5000000000ull));
    uint64_t base = pinned_kib();
    uint64_t whole = with - base;
    assert_true(copies >= 1);
    assert_int_equal(whole, copies * (SRC_LEN / 1024));
    uint64_t half_len = SRC_LEN / 2;
    /* Room for one half's copies and for part of the other's: the second half's registration
     * fails after some of its copies were made (when there are several NICs). */
    uint64_t room_kib = base + whole / 2 + whole / 4 + whole / 8;
    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &saved), 0);
    struct rlimit tight = {.rlim_cur = room_kib * 1024, .rlim_max = saved.rlim_max};
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < tight.rlim_cur)
        tight.rlim_max = tight.rlim_cur; /* raising the hard limit takes CAP_SYS_RESOURCE */
    if (setrlimit(RLIMIT_MEMLOCK, &tight) != 0) {
        print_message("skipped: the hard RLIMIT_MEMLOCK is below what the cell needs and cannot be raised\n");
        assert_int_equal(orb_register_host_memory(req.e, req.mem, 0, SRC_LEN, ORB_PERM_LOCAL, &req.id), 0);
        pair_down(&src, &req, seg);
        return;
    }
    bool had_cap = ipc_lock_effective(false);

    orb_reg_id first, second;
    assert_int_equal(orb_register_host_memory(req.e, req.mem, 0, half_len, ORB_PERM_LOCAL, &first), 0);
    assert_int_equal(pinned_kib(), base + whole / 2);
    assert_int_equal(orb_register_host_memory(req.e, req.mem, half_len, half_len, ORB_PERM_LOCAL, &second),
                     ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "RLIMIT_MEMLOCK"));
    assert_int_equal(pinned_kib(), base + whole / 2); /* the refused one's copies are gone */

    struct orb_batch_report rep;
    assert_int_equal(reads_at(&req, seg, &src, 0, 8, 65536 + 5, ORB_TRANSPORT_RDMA, &rep), 0);
    /* Into the half that is not registered: refused before anything moves. */
    assert_int_equal(reads_at(&req, seg, &src, half_len, 2, 65536, ORB_TRANSPORT_RDMA, &rep), ORB_ENOENT);
    assert_int_equal(rep.submitted_requests, 0);

    assert_int_equal(orb_unregister_memory(req.e, first), 0);
    assert_true(gauge_settles(&req, REGIONS, 0, 5000000000ull));
    assert_int_equal(pinned_kib(), base);
    assert_int_equal(orb_register_host_memory(req.e, req.mem, half_len, half_len, ORB_PERM_LOCAL, &second), 0);
    assert_int_equal(reads_at(&req, seg, &src, half_len, 8, 65536 + 5, ORB_TRANSPORT_RDMA, &rep), 0);
    assert_int_equal(orb_unregister_memory(req.e, second), 0);

    (void)ipc_lock_effective(had_cap);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &saved), 0);
    assert_int_equal(orb_register_host_memory(req.e, req.mem, 0, SRC_LEN, ORB_PERM_LOCAL, &req.id), 0);
    pair_down(&src, &req, seg);
}

/* Windows of the source's PDs: max_window_key_indices 16 each; every index carries at most 255
 * keys. Batches of 32 READs of 4 KiB (more grants at once than windows) until the keys run
 * out. */
static void test_window_keys_run_out(void **state)
{
    (void)state;
    /* A short io_timeout_s at the source: a grant a failed batch left unused expires (and gives
     * its window, with the keys its index has left, back) within seconds, not half a minute. */
    static const char *const kv[] = {"max_window_key_indices", "16", "io_timeout_s", "3", NULL};
    struct side src, req;
    orb_segment *seg = pair_up(&src, kv, &req, NULL);
    assert_non_null(seg->peer[ORB_TRANSPORT_RDMA]);
    uint32_t rails = strchr(SOURCE_NICS, ',') != NULL ? 2 : 1;
    const uint32_t n = 32, len = 4096;
    const uint64_t most = (uint64_t)rails * 16 * 255; /* grants the histories can ever serve */
    uint64_t served = 0;
    struct orb_batch_report rep;
    int rc = 0;
    while (rc == 0 && served <= most + n) {
        rc = reads_at(&req, seg, &src, 0, n, len, ORB_TRANSPORT_RDMA, &rep);
        served += rc == 0 ? n : rep.completed_requests;
    }
    assert_int_equal(rc, ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "max_window_key_indices"));
    assert_true(rep.done && rep.has_failure);
    assert_int_equal(rep.status, ORB_ERESOURCE);
    assert_int_equal(rep.failure.request_index, rep.completed_requests);
    assert_true(rep.failure.request_index + rep.failure.affected_requests <= n);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE); /* READs */
    assert_true(served <= most);
    /* Keys are not wasted: every index served most of its 255 keys (some are spent on windows a
     * failed grant could not prove over; none here). */
    assert_true(served >= most / 2);
    print_message("%llu grants served before the keys ran out (at most %llu)\n", (unsigned long long)served,
                  (unsigned long long)most);
    /* One PD's history runs out first; a request that lands on the other rail still gets that
     * rail's last keys. And keys come back: a refused batch's other requests may have been
     * granted and then left unused, and when the requester rebuilds that connection the source
     * frees those windows, whose indices the device may hand out again with keys left. So the
     * keys are drained one request at a time (a batch fails whole at its first refusal; each of
     * the grant threads takes its own turns among the rails, so a few refusals in a row need
     * not have tried both) until 32 refusals in a row, again until no rebuild happened
     * meanwhile. */
    uint32_t rounds = 0;
    for (bool again = true; again && served <= most + n; rounds++) {
        uint64_t rebuilds = stats_of(req.e).reconnects;
        /* Every grant left unused has expired (io_timeout_s + the source's grace) first. */
        bool settled = gauge_settles(&src, offsetof(struct orb_rdma_stats, grants_active), 0, 10000000000ull);
        for (int refused = 0; refused < 32 && served <= most + n;) {
            rc = reads_at(&req, seg, &src, 0, 1, len, ORB_TRANSPORT_RDMA, &rep);
            served += rc == 0 ? 1 : rep.completed_requests;
            refused = rc == ORB_ERESOURCE && rep.completed_requests == 0 ? refused + 1 : 0;
        }
        again = !settled || rebuilds != stats_of(req.e).reconnects || stats_of(src.e).grants_active != 0;
    }
    print_message("drained in %u round(s), %llu grants served in all\n", rounds, (unsigned long long)served);
    assert_int_equal(rc, ORB_ERESOURCE);
    assert_true(served <= most);
    /* Refused at once from now on, each time. */
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = orb_now_ns();
        assert_int_equal(reads_at(&req, seg, &src, 0, 4, len, ORB_TRANSPORT_RDMA, &rep), ORB_ERESOURCE);
        assert_true(orb_now_ns() - t0 < 2000000000ull);
        assert_int_equal(rep.completed_requests, 0);
    }
    assert_int_equal(reads_at(&req, seg, &src, 0, n, len, ORB_TRANSPORT_TCP, &rep), 0);
    /* No grant stays charged (the last served one's end may lag its ACK a moment). */
    if (!gauge_settles(&src, offsetof(struct orb_rdma_stats, grants_active), 0, 2000000000ull)) {
        struct orb_rdma_tp *tp = src.e->tp[ORB_TRANSPORT_RDMA].state;
        pthread_mutex_lock(&tp->lock);
        for (struct rdma_src_conn *c = tp->conns; c != NULL; c = c->next) {
            pthread_mutex_lock(&c->lock);
            for (struct rdma_grant *g = c->grants; g != NULL; g = g->next)
                print_message("still charged: grant %llu req %llu rails %x done %x binds_left %u abandoned %d expires %llu pub %d\n",
                              (unsigned long long)g->id, (unsigned long long)g->request, g->rail_mask, g->done_mask,
                              g->binds_left, g->abandoned, (unsigned long long)g->expires_ns, g->published);
            print_message("receives held per rail: %u %u\n", c->ngrants[0], c->ngrants[1]);
            pthread_mutex_unlock(&c->lock);
        }
        pthread_mutex_unlock(&tp->lock);
    }
    assert_int_equal(stats_of(src.e).grants_active, 0);
    pair_down(&src, &req, seg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requester_max_endpoints),
        cmocka_unit_test(test_source_max_endpoints),
        cmocka_unit_test(test_lanes_narrow_to_what_both_ends_hold),
        cmocka_unit_test(test_max_cqes_too_small_for_a_queue_pair),
        cmocka_unit_test(test_one_grant_at_a_time),
        cmocka_unit_test(test_one_send_wr_at_a_time),
        cmocka_unit_test(test_window_keys_run_out),
        cmocka_unit_test(test_locked_memory_limit),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
